//! The commit lifecycle: checkpoint store fencing, the commit manager, retention cleanup; and
//! the demo job end to end, killed with SIGKILL and restarted.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::ExitStatusExt as _;
use std::sync::Arc;

use blobsnap::backend::{
    Clock, StoreEngine, StoreSpec, SystemClock, TaskBackupManager as _, TaskContext,
};
use blobsnap::blob::backup::{BackupSettings, BlobBackupManager};
use blobsnap::blob::FACTORY_NAME;
use blobsnap::blobstore::counting::CountingStore;
use blobsnap::blobstore::Probe;
use blobsnap::blobstore::{list_all, BlobStore};
use blobsnap::checkpoint::{BlobCheckpointStore, Checkpoint, CheckpointStore, Ssp};
use blobsnap::commit::{Backend, TaskCommitManager};
use blobsnap::layout::JobScope;
use blobsnap::local::rocks::RocksStore;
use blobsnap::ErrorKind;

fn write_keys(db: &RocksStore, from: u32, n: u32, seed: u64) {
    support::rocks::write_keys_of(db, from, n, seed, 256);
}

fn task(h: &support::Harness) -> TaskContext {
    TaskContext {
        job_name: h.scope.as_str().trim_end_matches('/').to_string(),
        job_id: "1".into(),
        task_name: "Partition 0".into(),
    }
}

/// After each commit the store's objects are exactly the blobs and indexes of the last N
/// committed snapshots: nothing leaks, nothing needed is missing — with no sweep anywhere, and
/// across a restart (round 3) with a **new** backup manager, which finds the retained
/// snapshots again through the indexes' `prev-snapshot-index-blob-id` chain. Also: cleanup run
/// twice deletes nothing the second time; identical OPTIONS files and empty files survive.
async fn retention_case(h: &support::Harness, retention: usize) {
    let ctx = task(h);
    let counting = CountingStore::new(Arc::clone(&h.store));
    let counters = counting.counters();
    let store: Arc<dyn BlobStore> = Arc::new(counting);
    let checkpoints: Arc<dyn CheckpointStore> = Arc::new(BlobCheckpointStore::new(
        Arc::clone(&store),
        JobScope::new(&ctx.job_name, "1").unwrap(),
    ));
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let tmp = tempfile::tempdir().unwrap();
    let spec = StoreSpec {
        name: "counts".into(),
        dir: tmp.path().join("counts"),
    };
    let unsafe_ok = !checkpoints.enforces_exclusive_writes().await.unwrap();
    let (mgr, last) = TaskCommitManager::start(
        ctx.clone(),
        Arc::clone(&checkpoints),
        Arc::clone(&clock),
        retention,
        unsafe_ok,
    )
    .await
    .unwrap();
    let mut db = Arc::new(RocksStore::open("counts", &spec.dir).unwrap());
    let new_backup = || {
        Arc::new(
            BlobBackupManager::new(
                Arc::clone(&store),
                ctx.clone(),
                std::slice::from_ref(&spec),
                Arc::clone(&clock),
                BackupSettings {
                    retention,
                    writer_lease: false,
                    // What each commit costs and leaves, exactly: no background PUTs between
                    // (tests/it/preupload.rs covers those).
                    pre_upload: false,
                    ..Default::default()
                },
            )
            .unwrap(),
        )
    };
    let mut backup = new_backup();
    backup.init(last.as_ref()).await.unwrap();
    let mut mgr = mgr
        .with_stores(vec![Arc::clone(&db) as Arc<dyn StoreEngine>])
        .with_backends(
            vec![Backend {
                name: FACTORY_NAME.into(),
                manager: Arc::clone(&backup) as _,
            }],
            last,
        );
    let scope = JobScope::new(&ctx.job_name, "1")
        .unwrap()
        .store(&ctx.task_name, "counts")
        .unwrap();
    let mut committed: Vec<String> = Vec::new();
    for round in 0..6u32 {
        write_keys(&db, round * 400, 400, u64::from(round));
        if round == 3 {
            // Reopen: a new OPTIONS file with the same content, a new empty WAL. The process
            // stops as the runtime's tasks do: the last cleanup's deletes sent.
            mgr.finish().await.unwrap();
            drop(mgr);
            drop(db);
            db = Arc::new(RocksStore::open("counts", &spec.dir).unwrap());
            let (m, claim) = TaskCommitManager::start(
                ctx.clone(),
                Arc::clone(&checkpoints),
                Arc::new(SystemClock),
                retention,
                unsafe_ok,
            )
            .await
            .unwrap();
            // A new process: a new backup manager, which knows only the claim.
            backup = new_backup();
            backup.init(claim.as_ref()).await.unwrap();
            mgr = m
                .with_stores(vec![Arc::clone(&db) as Arc<dyn StoreEngine>])
                .with_backends(
                    vec![Backend {
                        name: FACTORY_NAME.into(),
                        manager: Arc::clone(&backup) as _,
                    }],
                    claim,
                );
        }
        let before = counters.snapshot();
        let report = mgr
            .commit(BTreeMap::from([(
                Ssp::new("files", "lines", 0),
                (round * 400).to_string(),
            )]))
            .await
            .unwrap();
        // What the commit cost (issue 19 §1, on every server this runs on): the upload's PUTs
        // and the checkpoint's, and at most one batch delete — the trim's, which carries the
        // last commit's cleanup.
        let d = counters.snapshot().since(&before);
        let uploads: u64 = backup.last_upload().values().map(|u| u.requests).sum();
        assert_eq!(d.put.calls, uploads + 1, "{}: round {round}: {d:?}", h.name);
        assert!(d.delete.calls <= 1, "{}: round {round}: {d:?}", h.name);
        committed.push(
            report
                .checkpoint
                .marker(FACTORY_NAME, "counts")
                .unwrap()
                .to_string(),
        );

        // Expected: every blob and index of the retained snapshots, and of the one that left
        // retention at this commit (its deletes go out with the next commit's trim).
        let expected =
            expected_objects(store.as_ref(), &ctx, &scope, &committed, retention + 1).await;
        let actual = objects_in(store.as_ref(), &scope).await;
        assert_eq!(
            actual, expected,
            "{}: retention {retention}, round {round}",
            h.name
        );
        // The checkpoint history is trimmed too (retention + the claim's slack).
        let hist = checkpoints.history(&ctx.task_name, 100).await.unwrap();
        assert!(
            hist.len() <= retention + 1,
            "{} checkpoints kept",
            hist.len()
        );
    }
    // A stopping task sends the deletes its last cleanup handed back: exactly the retained
    // snapshots remain.
    mgr.finish().await.unwrap();
    assert_eq!(
        objects_in(store.as_ref(), &scope).await,
        expected_objects(store.as_ref(), &ctx, &scope, &committed, retention).await,
        "{}: retention {retention}, after the last commit's deletes",
        h.name
    );
    // Cleanup is idempotent: running it again for the last commit deletes nothing.
    let before = counters.snapshot();
    let last_cp = checkpoints
        .latest(&ctx.task_name)
        .await
        .unwrap()
        .unwrap()
        .checkpoint;
    let v2 = last_cp.as_v2().unwrap();
    backup
        .cleanup(v2.id, &v2.state_checkpoint_markers[FACTORY_NAME])
        .await
        .unwrap();
    assert_eq!(counters.snapshot().since(&before).delete.requests, 0);
}

/// Every blob and index of the newest `n` of the `committed` markers.
async fn expected_objects(
    store: &dyn BlobStore,
    ctx: &TaskContext,
    scope: &blobsnap::layout::StoreScope,
    committed: &[String],
    n: usize,
) -> BTreeSet<String> {
    let mut expected = BTreeSet::new();
    for m in committed.iter().rev().take(n) {
        let idx = support::index_of(store, ctx, m).await;
        expected.insert(scope.key(m).unwrap().as_str().to_string());
        for (_, f) in idx.present_files() {
            for b in &f.blobs {
                expected.insert(scope.key(&b.blob_id).unwrap().as_str().to_string());
            }
        }
    }
    expected
}

/// Every object under the store's scope.
async fn objects_in(
    store: &dyn BlobStore,
    scope: &blobsnap::layout::StoreScope,
) -> BTreeSet<String> {
    list_all(store, scope.scope())
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.key.as_str().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_1_local() {
    retention_case(&support::local().await, 1).await
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_2_local() {
    retention_case(&support::local().await, 2).await
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_3_local() {
    retention_case(&support::local().await, 3).await
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_2_s3s() {
    retention_case(&support::s3s().await, 2).await
}

/// Two processes of one task: the later claim fences the earlier writer off.
async fn zombie_case(h: &support::Harness) {
    let ctx = task(h);
    let checkpoints: Arc<dyn CheckpointStore> = Arc::new(BlobCheckpointStore::new(
        Arc::clone(&h.store),
        JobScope::new(&ctx.job_name, "1").unwrap(),
    ));
    if h.store
        .capabilities(Probe::Never)
        .await
        .unwrap()
        .create_only
        != blobsnap::blobstore::CreateOnly::Atomic
    {
        // No fence on this server (Garage: If-None-Match ignored): the job must not start.
        let e = TaskCommitManager::start(ctx, checkpoints, Arc::new(SystemClock), 2, false)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Permanent, "{e}");
        assert!(e.to_string().contains("unsafe_no_fencing"), "{e}");
        return h.lacks("atomic create-only puts (the job was refused, as it must be)");
    }
    let (a, _) = TaskCommitManager::start(
        ctx.clone(),
        Arc::clone(&checkpoints),
        Arc::new(SystemClock),
        2,
        false,
    )
    .await
    .unwrap();
    let (b, _) = TaskCommitManager::start(
        ctx.clone(),
        Arc::clone(&checkpoints),
        Arc::new(SystemClock),
        2,
        false,
    )
    .await
    .unwrap();
    let e = a.commit(BTreeMap::new()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
    assert!(e.to_string().contains("fenced"), "{e}");
    b.commit(BTreeMap::new()).await.unwrap();
    let latest = checkpoints.latest(&ctx.task_name).await.unwrap().unwrap();
    assert_eq!(latest.writer, b.writer());
    assert_eq!(latest.seq, 3);
}

/// A checkpoint store where another writer (the zombie a starting task replaces) commits the
/// very number the newcomer writes, just before it, `races` times.
#[derive(Debug)]
struct RacingZombie {
    inner: Arc<dyn CheckpointStore>,
    races: std::sync::atomic::AtomicU32,
}

#[async_trait::async_trait]
impl CheckpointStore for RacingZombie {
    async fn enforces_exclusive_writes(&self) -> blobsnap::Result<bool> {
        self.inner.enforces_exclusive_writes().await
    }
    async fn latest(
        &self,
        task: &str,
    ) -> blobsnap::Result<Option<blobsnap::checkpoint::CommittedCheckpoint>> {
        self.inner.latest(task).await
    }
    async fn history(
        &self,
        task: &str,
        limit: usize,
    ) -> blobsnap::Result<Vec<blobsnap::checkpoint::CommittedCheckpoint>> {
        self.inner.history(task, limit).await
    }
    async fn write(
        &self,
        task: &str,
        seq: u64,
        writer: &str,
        checkpoint: &blobsnap::checkpoint::Checkpoint,
    ) -> blobsnap::Result<()> {
        use std::sync::atomic::Ordering;
        let left = self.races.load(Ordering::SeqCst);
        if left > 0 {
            self.races.store(left - 1, Ordering::SeqCst);
            self.inner.write(task, seq, "zombie", checkpoint).await?;
        }
        self.inner.write(task, seq, writer, checkpoint).await
    }
    async fn trim(&self, task: &str, keep: usize) -> blobsnap::Result<()> {
        self.inner.trim(task, keep).await
    }
    async fn delete_seqs(&self, task: &str, seqs: &[u64]) -> blobsnap::Result<()> {
        self.inner.delete_seqs(task, seqs).await
    }
}

/// A starting task whose claim loses to a commit of the process it replaces claims the next
/// number; a bounded number of times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_lost_to_the_zombie_is_retried_at_the_next_number() {
    let h = support::local().await;
    let ctx = task(&h);
    let inner: Arc<dyn CheckpointStore> = Arc::new(BlobCheckpointStore::new(
        Arc::clone(&h.store),
        JobScope::new(&ctx.job_name, "1").unwrap(),
    ));
    let start = |races: u32| {
        let checkpoints: Arc<dyn CheckpointStore> = Arc::new(RacingZombie {
            inner: Arc::clone(&inner),
            races: races.into(),
        });
        TaskCommitManager::start(ctx.clone(), checkpoints, Arc::new(SystemClock), 2, false)
    };
    // Two lost claims (numbers 1 and 2 go to the zombie), then number 3 is this process's.
    let (mgr, _) = start(2).await.unwrap();
    let latest = inner.latest(&ctx.task_name).await.unwrap().unwrap();
    assert_eq!((latest.seq, latest.writer.as_str()), (3, mgr.writer()));
    // A zombie that wins every time: the start gives up after 8 attempts, with `Conflict`.
    let e = start(u32::MAX).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
    assert!(e.to_string().contains("attempt 8 of 8"), "{e}");
    let latest = inner.latest(&ctx.task_name).await.unwrap().unwrap();
    assert_eq!((latest.seq, latest.writer.as_str()), (11, "zombie"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zombie_writer_is_fenced_local() {
    zombie_case(&support::local().await).await
}
mod external {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs BLOBSNAP_TEST_S3_ENDPOINT; run by scripts/test.sh"]
    async fn retention_1() {
        retention_case(&support::external().await, 1).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs BLOBSNAP_TEST_S3_ENDPOINT; run by scripts/test.sh"]
    async fn retention_2() {
        retention_case(&support::external().await, 2).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs BLOBSNAP_TEST_S3_ENDPOINT; run by scripts/test.sh"]
    async fn retention_3() {
        retention_case(&support::external().await, 3).await
    }

    /// The crash matrix against the external server (LocalStack in CI): the commit and
    /// restore points where S3's behaviour matters — the checkpoint write, the cleanup (its
    /// batch delete), a download in flight, the swap — on both hosts; `BLOBSNAP_CRASH_POINTS=all` (the
    /// long-test command) runs every point.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs BLOBSNAP_TEST_S3_ENDPOINT; run by scripts/test.sh"]
    async fn demo_survives_the_crash_matrix() {
        let h = support::external().await;
        let ms = super::MatrixStore::external(&h).await;
        let tmp = tempfile::tempdir().unwrap();
        let runs: u64 = std::env::var("BLOBSNAP_CRASH_RUNS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        let points = matrix_points(&[
            "commit.before-checkpoint",
            "commit.after-checkpoint",
            "commit.during-cleanup",
            "restore.mid-download",
            "restore.after-exchange",
            "preupload.after-named",
        ]);
        crash_matrix(&ms, tmp.path(), &points, runs).await;
        h.cleanup().await;
    }

    /// State through time (checkpoints, savepoints, rollback, roll-forward, gc) on the
    /// external server (LocalStack and Garage in scripts/test.sh).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs BLOBSNAP_TEST_S3_ENDPOINT; run by scripts/test.sh"]
    async fn state_through_time() {
        let h = support::external().await;
        let ms = super::MatrixStore::external(&h).await;
        let tmp = tempfile::tempdir().unwrap();
        super::state_through_time(&ms, tmp.path()).await;
        h.cleanup().await;
    }

    /// Zero-copy forks (see `forks`) on the S3 server.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs BLOBSNAP_TEST_S3_ENDPOINT; run by scripts/test.sh"]
    async fn forks() {
        let h = support::external().await;
        let ms = super::MatrixStore::external(&h).await;
        let tmp = tempfile::tempdir().unwrap();
        super::forks(&ms, tmp.path()).await;
        h.cleanup().await;
    }

    /// The demo on LocalStack (create-only enforced: fencing on), killed once and resumed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs BLOBSNAP_TEST_S3_ENDPOINT; run by scripts/test.sh"]
    async fn demo_survives_kill_9() {
        let h = support::external().await;
        let support::Kind::S3(s3) = &h.kind else {
            unreachable!()
        };
        let (endpoint, bucket, region) = (
            s3.config().endpoint.clone().unwrap(),
            s3.config().bucket.clone(),
            s3.config().region.clone().unwrap(),
        );
        // Where the server cannot fence, the demo refuses to start unless told.
        let fences = h
            .store
            .capabilities(Probe::Never)
            .await
            .unwrap()
            .create_only
            == blobsnap::blobstore::CreateOnly::Atomic;
        let ak = std::env::var("BLOBSNAP_TEST_S3_ACCESS_KEY").unwrap_or_else(|_| "test".into());
        let sk = std::env::var("BLOBSNAP_TEST_S3_SECRET_KEY").unwrap_or_else(|_| "test".into());
        let tmp = tempfile::tempdir().unwrap();
        let bin = env!("CARGO_BIN_EXE_blobsnap");
        let run = || {
            let mut cmd = tokio::process::Command::new(bin);
            cmd.args([
                "--json",
                "--bucket",
                &bucket,
                "--s3-endpoint",
                &endpoint,
                "--s3-region",
                &region,
                "--s3-path-style",
                "--s3-prefix",
                h.scope.as_str(),
                "demo",
                "--dir",
            ])
            .arg(tmp.path())
            .args((!fences).then_some("--unsafe-no-fencing"))
            .args([
                "--partitions",
                "2",
                "--lines",
                "4000",
                "--commit-every",
                "400",
            ])
            .env("AWS_ACCESS_KEY_ID", &ak)
            .env("AWS_SECRET_ACCESS_KEY", &sk);
            cmd
        };
        kill_when_held(run(), "commit.after-checkpoint").await;
        demo_counts_ok(&run().output().await.unwrap());
        h.cleanup().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs BLOBSNAP_TEST_S3_ENDPOINT; run by scripts/test.sh"]
    async fn zombie_writer_is_fenced() {
        zombie_case(&support::external().await).await
    }

    /// Two real processes, one job, on an S3 server. Where the server enforces create-only
    /// writes (LocalStack) the later one fences the earlier off; where it does not (Garage),
    /// the job refuses to start without `--unsafe-no-fencing`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs BLOBSNAP_TEST_S3_ENDPOINT; run by scripts/test.sh"]
    async fn two_processes_one_job_the_zombie_stops_with_conflict() {
        let h = support::external().await;
        let support::Kind::S3(s3) = &h.kind else {
            unreachable!()
        };
        let ak = std::env::var("BLOBSNAP_TEST_S3_ACCESS_KEY").unwrap_or_else(|_| "test".into());
        let sk = std::env::var("BLOBSNAP_TEST_S3_SECRET_KEY").unwrap_or_else(|_| "test".into());
        let c = s3.config();
        let store_args: Vec<std::ffi::OsString> = vec![
            "--bucket".into(),
            c.bucket.clone().into(),
            "--s3-endpoint".into(),
            c.endpoint.clone().unwrap().into(),
            "--s3-region".into(),
            c.region.clone().unwrap().into(),
            "--s3-path-style".into(),
            "--s3-prefix".into(),
            h.scope.as_str().into(),
        ];
        let envs = vec![
            ("AWS_ACCESS_KEY_ID".to_string(), ak.clone()),
            ("AWS_SECRET_ACCESS_KEY".to_string(), sk.clone()),
        ];
        if h.store
            .capabilities(Probe::Never)
            .await
            .unwrap()
            .create_only
            != blobsnap::blobstore::CreateOnly::Atomic
        {
            let tmp = tempfile::tempdir().unwrap();
            let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
                .args(&store_args)
                .args(["demo", "--dir"])
                .arg(tmp.path())
                .envs(envs.iter().map(|(k, v)| (k, v)))
                .output()
                .await
                .unwrap();
            assert!(!out.status.success(), "a job without a fence must refuse");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains("unsafe_no_fencing") || err.contains("unsafe-no-fencing"),
                "{err}"
            );
            return;
        }
        let mut config = c.clone();
        config.prefix = h.scope.as_str().to_string();
        let prefixed: Arc<dyn BlobStore> = Arc::new(
            blobsnap::blobstore::s3::S3Store::connect_with_credentials(config, &ak, &sk, None)
                .await
                .unwrap(),
        );
        two_process_zombie_case(prefixed, store_args, envs, 8_000).await;
        h.cleanup().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_cannot_fence_is_refused() {
    let h = support::s3s().await; // create-only is racy on s3s-fs
    let ctx = task(&h);
    let checkpoints: Arc<dyn CheckpointStore> = Arc::new(BlobCheckpointStore::new(
        Arc::clone(&h.store),
        JobScope::new(&ctx.job_name, "1").unwrap(),
    ));
    let e = TaskCommitManager::start(
        ctx.clone(),
        Arc::clone(&checkpoints),
        Arc::new(SystemClock),
        2,
        false,
    )
    .await
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Permanent);
    assert!(e.to_string().contains("unsafe_no_fencing"), "{e}");
    TaskCommitManager::start(ctx, checkpoints, Arc::new(SystemClock), 2, true)
        .await
        .unwrap();
}

/// Every key under the demo job's scope.
/// Every key of the demo job's scope but its owner record (which the job writes once and the
/// sweep never touches); writer leases count (a stopped job leaves none).
async fn job_keys(store: &dyn BlobStore) -> BTreeSet<String> {
    let owner = JobScope::new("wordcount", "1")
        .unwrap()
        .owner_record()
        .unwrap();
    list_all(store, JobScope::new("wordcount", "1").unwrap().scope())
        .await
        .unwrap()
        .into_iter()
        .filter(|m| m.key != owner)
        .map(|m| m.key.as_str().to_string())
        .collect()
}

/// Before a sweep, everything the demo job's retained checkpoints reference exists; after
/// `gc --job wordcount --grace-secs 0` (appended to `blobsnap`, the CLI with its global store
/// flags), exactly that is left. Returns how many objects the sweep deleted.
async fn sweep_leaves_exactly_the_referenced(
    mut blobsnap: tokio::process::Command,
    store: &Arc<dyn BlobStore>,
    partitions: u32,
    what: &str,
) -> usize {
    let before = job_keys(store.as_ref()).await;
    let owner_before = owner_record(store.as_ref(), what).await;
    server_clock_past_newest(store.as_ref(), what).await;
    let expected = support::referenced(store, "wordcount", partitions).await;
    let missing: Vec<_> = expected.difference(&before).collect();
    assert!(
        missing.is_empty(),
        "{what}: referenced but missing: {missing:?}"
    );
    let out = blobsnap
        .args(["gc", "--job", "wordcount", "--grace-secs", "0", "--force"])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{what}: gc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = job_keys(store.as_ref()).await;
    assert_eq!(
        after, expected,
        "{what}: after a sweep with grace 0, exactly the referenced objects remain"
    );
    // ... and the owner record (`scope.json`, left out of both sets) is there, unchanged.
    assert_eq!(
        owner_record(store.as_ref(), what).await,
        owner_before,
        "{what}: scope.json untouched"
    );
    before.len() - after.len()
}

/// A sweep with grace 0 keeps what is not older than its cutoff, the server's clock read by
/// a probe: on a server whose times have whole seconds, an orphan written in the second of
/// the sweep is young, by design. Wait until the server's clock has passed the newest object
/// of the demo job (an event on that clock; the bound only catches a stopped clock).
async fn server_clock_past_newest(store: &dyn BlobStore, what: &str) {
    let job = JobScope::new("wordcount", "1").unwrap();
    let newest = list_all(store, job.scope())
        .await
        .unwrap()
        .into_iter()
        .filter_map(|m| m.last_modified)
        .max();
    let Some(newest) = newest else { return };
    let since = std::time::Instant::now();
    while blobsnap::blob::gc::server_now(store, &job).await.unwrap() <= newest {
        assert!(
            since.elapsed() < std::time::Duration::from_secs(60),
            "{what}: the server's clock does not pass its newest object's time"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The bytes of the demo job's owner record (`scope.json`).
async fn owner_record(store: &dyn BlobStore, what: &str) -> Vec<u8> {
    let owner = JobScope::new("wordcount", "1")
        .unwrap()
        .owner_record()
        .unwrap();
    blobsnap::blobstore::get_bytes(store, &owner, 1 << 20)
        .await
        .unwrap_or_else(|e| panic!("{what}: the scope's owner record: {e}"))
        .to_vec()
}

/// Run `gc` with `BLOBSNAP_CRASH_AT=at`; it must die by SIGKILL there. Returns the demo job's
/// keys left after it.
async fn sweep_killed_at(
    mut gc: tokio::process::Command,
    at: &str,
    store: &Arc<dyn BlobStore>,
) -> BTreeSet<String> {
    let out = gc.env("BLOBSNAP_CRASH_AT", at).output().await.unwrap();
    assert_eq!(out.status.signal(), Some(9), "the sweep was killed at {at}");
    job_keys(store.as_ref()).await
}

/// Run `cmd` (a demo) until it reaches hold point `point` (`BLOBSNAP_HOLD_AT`, never
/// released), then SIGKILL it there: a kill that lands mid-job, after a commit, whatever the
/// machine's speed. Fails if the demo ends first or is not killed by the signal.
async fn kill_when_held(mut cmd: tokio::process::Command, point: &str) {
    use std::os::unix::process::ExitStatusExt as _;
    use tokio::io::AsyncBufReadExt as _;
    let never = tempfile::tempdir().unwrap();
    let mut child = cmd
        .kill_on_drop(true)
        .env("BLOBSNAP_HOLD_AT", point)
        .env("BLOBSNAP_HOLD_UNTIL", never.path().join("never"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut log = String::new();
    loop {
        let Some(line) = lines.next_line().await.unwrap() else {
            panic!("the demo ended before it reached {point}: {log}");
        };
        log.push_str(&line);
        log.push('\n');
        if line.contains(&format!("hold point {point} reached")) {
            break;
        }
    }
    child.start_kill().unwrap();
    let status = child.wait().await.unwrap();
    assert_eq!(
        status.signal(),
        Some(9),
        "killed at {point}: {status:?} {log}"
    );
}

fn demo_counts_ok(out: &std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "demo failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["check"], "ok", "{v}");
    v
}

/// Where the crash matrix keeps its blob stores: local dirs, or prefixes of an S3 bucket.
enum MatrixStore {
    Local,
    S3 {
        config: Box<blobsnap::blobstore::s3::S3Config>,
        root: String,
        ak: String,
        sk: String,
        fences: bool,
    },
}

/// One leg of the matrix: the CLI's global store flags and env, and the same store for the
/// test's own reads.
struct Leg {
    flags: Vec<String>,
    env: Vec<(String, String)>,
    extra: Vec<String>,
    store: Arc<dyn BlobStore>,
}

impl MatrixStore {
    /// The matrix store on the external S3 server of `h` (fencing as the server allows).
    async fn external(h: &support::Harness) -> Self {
        let support::Kind::S3(s3) = &h.kind else {
            panic!("not an S3 harness")
        };
        let fences = h
            .store
            .capabilities(Probe::Never)
            .await
            .unwrap()
            .create_only
            == blobsnap::blobstore::CreateOnly::Atomic;
        MatrixStore::S3 {
            config: Box::new(s3.config().clone()),
            root: h.scope.as_str().to_string(),
            ak: std::env::var("BLOBSNAP_TEST_S3_ACCESS_KEY").unwrap_or_else(|_| "test".into()),
            sk: std::env::var("BLOBSNAP_TEST_S3_SECRET_KEY").unwrap_or_else(|_| "test".into()),
            fences,
        }
    }

    async fn leg(&self, dir: &std::path::Path, name: &str) -> Leg {
        match self {
            MatrixStore::Local => Leg {
                flags: vec!["--local".into(), dir.join("store").display().to_string()],
                env: vec![],
                extra: vec![],
                store: Arc::new(
                    blobsnap::blobstore::local::LocalStore::new(dir.join("store")).unwrap(),
                ),
            },
            MatrixStore::S3 {
                config,
                root,
                ak,
                sk,
                fences,
            } => {
                let prefix = format!("{root}{name}/");
                let mut c = (**config).clone();
                c.prefix = prefix.clone();
                let store =
                    blobsnap::blobstore::s3::S3Store::connect_with_credentials(c, ak, sk, None)
                        .await
                        .unwrap();
                Leg {
                    flags: vec![
                        "--bucket".into(),
                        config.bucket.clone(),
                        "--s3-endpoint".into(),
                        config.endpoint.clone().unwrap(),
                        "--s3-region".into(),
                        config.region.clone().unwrap_or_else(|| "us-east-1".into()),
                        "--s3-path-style".into(),
                        "--s3-prefix".into(),
                        prefix,
                    ],
                    env: vec![
                        ("AWS_ACCESS_KEY_ID".into(), ak.clone()),
                        ("AWS_SECRET_ACCESS_KEY".into(), sk.clone()),
                    ],
                    extra: if *fences {
                        vec![]
                    } else {
                        vec!["--unsafe-no-fencing".into()]
                    },
                    store: Arc::new(store),
                }
            }
        }
    }
}

impl Leg {
    fn cmd(&self, args: &[String]) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"));
        c.arg("--json")
            .args(&self.flags)
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        c
    }

    fn demo(&self, dir: &std::path::Path) -> Vec<String> {
        let mut a: Vec<String> = [
            "demo",
            "--dir",
            &dir.display().to_string(),
            "--partitions",
            "3",
            "--lines",
            "6000",
            "--commit-every",
            "400",
        ]
        .map(String::from)
        .to_vec();
        a.extend(self.extra.iter().cloned());
        a
    }

    /// [`Leg::demo`] for crash point `point`: a `lazy.*` point is reached only by a lazy
    /// restore, so its runs restore lazily (the restart after the crash too).
    fn demo_for(&self, dir: &std::path::Path, point: &str) -> Vec<String> {
        let mut a = self.demo(dir);
        if point.starts_with("lazy.") {
            a.extend(["--restore-mode".to_string(), "lazy".to_string()]);
        }
        a
    }
}

/// Wait until `task` has committed input offsets (a real commit, not only the claim of an
/// empty checkpoint), while `child` runs.
async fn wait_for_offsets(
    cps: &BlobCheckpointStore,
    task: &str,
    child: &mut tokio::process::Child,
) {
    let started = std::time::Instant::now();
    loop {
        let latest = cps.latest(task).await.unwrap();
        if latest.is_some_and(|c| !c.checkpoint.offsets().is_empty()) {
            return;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(120),
            "{task} never committed"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the process ended before {task} committed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The crash points a job's run reaches: every point but an operator command's (`forget.*`,
/// which `cli::forget_removes_a_fork_a_deployment_and_one_checkpoint` kills at) and the Samza
/// plug-in's (`samza.*`, which the Java stage's `KafkaJobTest` and samza-s3's `SamzaJobTest`
/// kill at), and `sweep.after-prepared` (a hold point of
/// `cli::a_promotion_while_a_sweep_reads_its_roots_loses_nothing`).
fn job_points() -> Vec<&'static str> {
    blobsnap::crash::POINTS
        .iter()
        .copied()
        .filter(|p| {
            !p.starts_with("forget.") && !p.starts_with("samza.") && *p != "sweep.after-prepared"
        })
        .collect()
}

/// The crash points to run: `BLOBSNAP_CRASH_POINTS=a,b` (a name that is not a crash point
/// fails the test; `all`: every point a job reaches), else `default`.
fn matrix_points(default: &[&'static str]) -> Vec<&'static str> {
    let only: Option<Vec<String>> = std::env::var("BLOBSNAP_CRASH_POINTS")
        .ok()
        .filter(|v| v != "all")
        .map(|v| v.split(',').map(str::to_string).collect());
    if std::env::var("BLOBSNAP_CRASH_POINTS").as_deref() == Ok("all") {
        return job_points();
    }
    for name in only.iter().flatten() {
        assert!(
            blobsnap::crash::POINTS.contains(&name.as_str()),
            "BLOBSNAP_CRASH_POINTS: {name:?} is not a crash point"
        );
    }
    match only {
        Some(o) => blobsnap::crash::POINTS
            .iter()
            .copied()
            .filter(|p| o.iter().any(|x| x == p))
            .collect(),
        None => default.to_vec(),
    }
}

/// The crash matrix: every point of `points`, `runs` times, twice — once with the local state
/// kept (restart on the same host), once with it deleted first (restart on a new host: the
/// restore downloads). Each leg first gets a run killed once it has committed (seeded runs:
/// a seeded moment later, and a seeded hit number `point@N`), so there is something to
/// restore. After the crash, the restart must resume from exactly the last committed
/// checkpoint's offsets with the right counts, a sweep with grace 0 must leave exactly what the
/// retained checkpoints reference, and every point must have been reached in every run.
async fn crash_matrix(ms: &MatrixStore, root: &std::path::Path, points: &[&str], runs: u64) {
    use rand::{Rng as _, SeedableRng as _};
    let mut seeded = rand::rngs::StdRng::seed_from_u64(2026);
    // `blobsnap ARGS` on `leg` with `BLOBSNAP_CRASH_AT=at` (if any): true if it died there
    // (SIGKILL), false if it ran to a successful end.
    let crash_run = |leg: &Leg, args: Vec<String>, at: Option<String>| {
        let mut cmd = leg.cmd(&args);
        async move {
            if let Some(at) = &at {
                cmd.env("BLOBSNAP_CRASH_AT", at);
            }
            let out = cmd.output().await.unwrap();
            if out.status.success() {
                false
            } else {
                assert_eq!(
                    out.status.signal(),
                    Some(9),
                    "{at:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                true
            }
        }
    };
    let mut reached: BTreeMap<&str, u64> = BTreeMap::new();
    // Per run and point: how many of its two legs died there.
    let mut reached_in_run: BTreeMap<(u64, &str), u64> = BTreeMap::new();
    for run in 0..runs {
        for (i, point) in points.iter().enumerate() {
            for new_host in [false, true] {
                let name = format!("points-{run}-{i}-{new_host}");
                let dir = root.join(&name);
                let mut leg = ms.leg(&dir, &name).await;
                // Pre-upload (off by default) for its own crash points, and on the new-host leg
                // of every other point (its worker's uploads in flight); the first leg runs the
                // default.
                if point.starts_with("preupload.") || new_host {
                    leg.env
                        .push(("BLOBSNAP_PRE_UPLOAD".to_string(), "true".to_string()));
                }
                let store = Arc::clone(&leg.store);
                let cps = BlobCheckpointStore::new(
                    Arc::clone(&store),
                    JobScope::new("wordcount", "1").unwrap(),
                );
                let (post_commit_ms, nth) = if run == 0 {
                    (0, 1)
                } else {
                    (seeded.random_range(0..800), seeded.random_range(1..=3u32))
                };
                let target = format!("{point}@{nth}");
                // A first run killed once it has committed (then, in seeded runs, a little
                // later): there is a checkpoint to restore, and work in flight.
                let mut child = leg
                    .cmd(&leg.demo_for(&dir, point))
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .unwrap();
                wait_for_offsets(&cps, "Partition 0", &mut child).await;
                tokio::time::sleep(std::time::Duration::from_millis(post_commit_ms)).await;
                let _ = child.start_kill();
                let _ = child.wait().await;
                let died = if *point == "sweep.mid-delete" {
                    // The sweep's point is the sweep's: orphans of a commit killed before its
                    // checkpoint, a clean run (the task's leases go with it), then `gc`.
                    assert!(
                        crash_run(
                            &leg,
                            leg.demo_for(&dir, point),
                            Some("commit.before-checkpoint".into())
                        )
                        .await,
                        "commit.before-checkpoint not reached"
                    );
                    assert!(!crash_run(&leg, leg.demo_for(&dir, point), None).await);
                    // The orphans must be older than the sweep's grace-0 cutoff to be deleted
                    // (and the point reached).
                    server_clock_past_newest(store.as_ref(), point).await;
                    let gc = ["gc", "--job", "wordcount", "--grace-secs", "0", "--force"]
                        .map(String::from)
                        .to_vec();
                    let died = crash_run(&leg, gc, Some(target.clone())).await;
                    if new_host {
                        let _ = std::fs::remove_dir_all(dir.join("state"));
                    }
                    died
                } else {
                    if new_host {
                        let _ = std::fs::remove_dir_all(dir.join("state"));
                    }
                    crash_run(&leg, leg.demo_for(&dir, point), Some(target.clone())).await
                };
                if died {
                    *reached.entry(point).or_default() += 1;
                    *reached_in_run.entry((run, point)).or_default() += 1;
                }
                // The restart restores the last committed checkpoint: it resumes from exactly
                // its input offsets (and, since the counts come out right, with exactly its
                // state: a store that were empty or older would count the lines before the
                // offset wrongly).
                let mut committed: BTreeMap<String, u64> = BTreeMap::new();
                for p in 0..3 {
                    let task = format!("Partition {p}");
                    // No checkpoint, or only a claim of an empty one: offset 0.
                    let offset = cps
                        .latest(&task)
                        .await
                        .unwrap()
                        .and_then(|c| {
                            c.checkpoint
                                .offsets()
                                .get(&Ssp::new("files", "lines", p))
                                .map(|o| o.parse().unwrap())
                        })
                        .unwrap_or(0);
                    committed.insert(task, offset);
                }
                let out = leg.cmd(&leg.demo_for(&dir, point)).output().await.unwrap();
                let v = demo_counts_ok(&out);
                for t in v["tasks"].as_array().unwrap() {
                    let task = t["task"].as_str().unwrap();
                    assert_eq!(
                        t["resumed-from"].as_u64(),
                        Some(committed[task]),
                        "{point} (run {run}, new host {new_host}): {task} resumed from the last committed checkpoint's offset: {v}"
                    );
                }
                // Then a sweep with grace 0 leaves exactly what the retained checkpoints
                // reference: the crash's orphans go, nothing committed does.
                sweep_leaves_exactly_the_referenced(
                    leg.cmd(&[]),
                    &store,
                    3,
                    &format!("{point} (run {run}, new host {new_host})"),
                )
                .await;
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
    }
    eprintln!("crash matrix: {runs} run(s) per point and host, killed at: {reached:?}");
    // Every point is reached in every matrix run — checked run by run, not in aggregate (on
    // one host or the other: on the same host a restore may have nothing to download). Two
    // points are hit once per blob PUT and once per delete batch: their seeded 2nd or 3rd hit
    // exists only if the restart still has that much to upload or delete (a seeded kill up to
    // 0.8 s after the first commit can leave a release build almost nothing to do). They are
    // checked in the first run (killed right at its first commit, hit 1); in the seeded runs
    // they are counted (printed above), not required.
    let by_amount = ["backup.mid-upload", "sweep.mid-delete"];
    let missed: Vec<(u64, &str)> = (0..runs)
        .flat_map(|run| points.iter().map(move |p| (run, *p)))
        .filter(|(run, p)| *run == 0 || !by_amount.contains(p))
        .filter(|k| reached_in_run.get(k).copied().unwrap_or(0) == 0)
        .collect();
    assert!(
        missed.is_empty(),
        "crash points not reached, as (run, point): {missed:?} (reached: {reached:?})"
    );
}

/// The demo, killed with SIGKILL at random moments and at every named crash point, always
/// resumes from its last committed checkpoint and ends with counts equal to an independent
/// count of the input (local store; `BLOBSNAP_CRASH_RUNS`, default 1, the long-test command
/// 25, repeats the matrix with seeded moments and hit numbers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_survives_kill_9_local() {
    use rand::{Rng as _, SeedableRng as _};
    let bin = env!("CARGO_BIN_EXE_blobsnap");
    let tmp = tempfile::tempdir().unwrap();
    let args = |dir: &std::path::Path| -> Vec<String> {
        vec![
            "--json".into(),
            "demo".into(),
            "--dir".into(),
            dir.display().to_string(),
            "--partitions".into(),
            "3".into(),
            "--lines".into(),
            "6000".into(),
            "--commit-every".into(),
            "400".into(),
        ]
    };
    let runs: u64 = std::env::var("BLOBSNAP_CRASH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    crash_matrix(
        &MatrixStore::Local,
        tmp.path(),
        &matrix_points(&job_points()),
        runs,
    )
    .await;
    // Random SIGKILLs, then a run to the end.
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let dir = tmp.path().join("random");
    for _ in 0..6 {
        let mut child = tokio::process::Command::new(bin)
            .args(args(&dir))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(rng.random_range(50..900))).await;
        let _ = child.start_kill(); // SIGKILL
        let _ = child.wait().await;
    }
    let out = tokio::process::Command::new(bin)
        .args(args(&dir))
        .output()
        .await
        .unwrap();
    let v = demo_counts_ok(&out);
    assert!(v["total"].as_u64().unwrap() > 0);
}

/// The demo against the in-process S3 server (s3s-fs cannot fence: the flag is required).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_on_s3s() {
    let h = support::s3s().await;
    let (endpoint, bucket) = match &h.kind {
        support::Kind::S3(s) => (
            s.config().endpoint.clone().unwrap(),
            s.config().bucket.clone(),
        ),
        support::Kind::Local(_) => unreachable!(),
    };
    let tmp = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_blobsnap");
    let run = |extra: &[&str]| {
        let mut cmd = tokio::process::Command::new(bin);
        cmd.args([
            "--json",
            "--bucket",
            &bucket,
            "--s3-endpoint",
            &endpoint,
            "--s3-region",
            "us-east-1",
            "--s3-path-style",
            "--s3-prefix",
            h.scope.as_str(),
            "demo",
            "--dir",
        ])
        .arg(tmp.path())
        .args([
            "--partitions",
            "2",
            "--lines",
            "3000",
            "--commit-every",
            "500",
        ])
        .args(extra)
        .env("BLOBSNAP_S3_CREATE_ONLY", "racy")
        .env("AWS_ACCESS_KEY_ID", support::S3S_ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", support::S3S_SECRET_KEY);
        cmd
    };
    let out = run(&[]).output().await.unwrap();
    assert_eq!(
        out.status.code(),
        Some(8),
        "refused without fencing: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("unsafe_no_fencing"));
    let out = run(&["--unsafe-no-fencing"]).output().await.unwrap();
    demo_counts_ok(&out);
    // The committed state is in the bucket: checkpoints for both tasks.
    let cps = list_all(
        h.store.as_ref(),
        &blobsnap::blobstore::Scope::new(h.scope.as_str().to_string()).unwrap(),
    )
    .await
    .unwrap();
    assert!(
        cps.iter()
            .any(|m| m.key.as_str().contains("/checkpoints/Partition%201/")),
        "{cps:?}"
    );
}

/// After a demo killed several times, a sweep with grace 0 leaves exactly what the retained
/// checkpoints reference: no leak, nothing missing; and the job still restores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_after_kills_leaves_exactly_the_referenced_objects() {
    use rand::{Rng as _, SeedableRng as _};
    let bin = env!("CARGO_BIN_EXE_blobsnap");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo");
    let demo = |extra: &[&str]| {
        let mut cmd = tokio::process::Command::new(bin);
        cmd.args(["--json", "demo", "--dir"])
            .arg(&dir)
            .args([
                "--partitions",
                "3",
                "--lines",
                "6000",
                "--commit-every",
                "300",
            ])
            .args(extra);
        cmd
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for _ in 0..5 {
        let mut child = demo(&[])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(rng.random_range(100..900))).await;
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
    // Also a crash between upload and checkpoint write: orphan blobs for the sweep.
    let _ = demo(&[])
        .env("BLOBSNAP_CRASH_AT", "commit.before-checkpoint")
        .output()
        .await
        .unwrap();
    demo_counts_ok(&demo(&[]).output().await.unwrap());

    let store: Arc<dyn BlobStore> =
        Arc::new(blobsnap::blobstore::local::LocalStore::new(dir.join("store")).unwrap());
    let job_scope = JobScope::new("wordcount", "1").unwrap();
    let before: BTreeSet<String> = job_keys(store.as_ref()).await;
    let expected = support::referenced(&store, "wordcount", 3).await;
    assert!(
        before.is_superset(&expected),
        "something referenced is missing before the sweep"
    );
    assert!(
        before.len() > expected.len(),
        "the crashes left orphans to sweep"
    );

    let gc = |dry: bool| {
        let mut cmd = tokio::process::Command::new(bin);
        cmd.args(["--json", "--local"])
            .arg(dir.join("store"))
            .args(["gc", "--job", "wordcount", "--grace-secs", "0", "--force"]);
        if dry {
            cmd.arg("--dry-run");
        }
        cmd
    };
    let out = gc(true).output().await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dry: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let planned: BTreeSet<String> = dry["plan"]["delete"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["key"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(dry["plan"]["unknown"].as_array().unwrap().len(), 0, "{dry}");
    let after_dry: BTreeSet<String> = job_keys(store.as_ref()).await;
    assert_eq!(after_dry, before, "a dry run deletes nothing");
    assert!(
        planned.is_disjoint(&expected),
        "the plan never touches a referenced object"
    );

    // A sweep killed (SIGKILL) after its first delete batch deleted nothing referenced.
    let mid = sweep_killed_at(gc(false), "sweep.mid-delete", &store).await;
    assert!(
        expected.is_subset(&mid),
        "a killed sweep deleted nothing referenced"
    );

    // More kills mid-delete, `BLOBSNAP_CRASH_RUNS` times (default 1; the long test: 25): each
    // time 2,500 orphan blobs (3 delete batches) are planted in a task's store scope and the
    // sweep is killed after a seeded first or second batch: nothing referenced is ever gone.
    let runs: u64 = std::env::var("BLOBSNAP_CRASH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    use futures::StreamExt as _;
    let sscope = job_scope.store("Partition 0", "counts").unwrap();
    let old: blobsnap::checkpoint::CheckpointId = "1000-1".parse().unwrap();
    for run in 0..runs {
        futures::stream::iter(0..2500)
            .map(|i| {
                let body = format!("orphan {run} {i}");
                let sha = blobsnap::digest::Sha256::of(body.as_bytes());
                let key = sscope
                    .key(&blobsnap::layout::StoreScope::blob_id(old, sha))
                    .unwrap();
                let store = Arc::clone(&store);
                async move {
                    store
                        .put(
                            &key,
                            blobsnap::blobstore::PutBody::Bytes(body.into()),
                            blobsnap::blobstore::PutOptions::create_only(sha),
                        )
                        .await
                        .unwrap();
                }
            })
            .buffer_unordered(32)
            .collect::<Vec<()>>()
            .await;
        let nth = rng.random_range(1..=2u32);
        let mid = sweep_killed_at(gc(false), &format!("sweep.mid-delete@{nth}"), &store).await;
        assert!(
            expected.is_subset(&mid),
            "run {run}: a sweep killed after batch {nth} deleted something referenced"
        );
        assert!(
            mid.len() >= expected.len() + 2500 - 1000 * nth as usize,
            "run {run}: the sweep was killed before it deleted everything (after batch {nth} of 3)"
        );
    }

    let out = gc(false).output().await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after: BTreeSet<String> = job_keys(store.as_ref()).await;
    assert_eq!(after, expected, "exactly the referenced objects remain");
    assert_eq!(
        before.difference(&after).cloned().collect::<BTreeSet<_>>(),
        planned,
        "the dry run listed exactly what the real run deleted"
    );
    assert!(store
        .incomplete_uploads(job_scope.scope(), None)
        .await
        .unwrap()
        .is_empty());
    // The job still restores and ends correct.
    let _ = std::fs::remove_dir_all(dir.join("state"));
    demo_counts_ok(&demo(&[]).output().await.unwrap());
}

/// An embedder that drives the blob backend itself (no `run_task`) and a manual backup hold a
/// writer lease while an upload may be in flight (N1 of the second protocol review): a forced
/// sweep under the grace is refused while it lives, and `close` (the backup's end) deletes it.
/// Fails before the fix: no lease was written, and the forced short sweep was accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedders_and_a_manual_backups_uploads_hold_a_writer_lease() {
    use blobsnap::blob::admin::{active_writers, sweep_guard};
    use std::time::Duration;
    let h = support::local().await;
    let ctx = task(&h);
    let job = JobScope::new(&ctx.job_name, &ctx.job_id).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let spec = StoreSpec {
        name: "counts".into(),
        dir: tmp.path().join("counts"),
    };
    let backup = BlobBackupManager::new(
        Arc::clone(&h.store),
        ctx.clone(),
        std::slice::from_ref(&spec),
        Arc::new(SystemClock),
        BackupSettings::default(),
    )
    .unwrap();
    backup.init(None).await.unwrap();
    let db = RocksStore::open("counts", &spec.dir).unwrap();
    write_keys(&db, 0, 100, 1);
    let id = "1000-0".parse().unwrap();
    db.checkpoint_to(&spec.checkpoint_dir(id)).unwrap();
    backup
        .upload(
            id,
            &Default::default(),
            &BTreeMap::from([("counts".into(), spec.checkpoint_dir(id))]),
        )
        .await
        .unwrap();
    let active = active_writers(h.store.as_ref(), &job, SystemClock.now())
        .await
        .unwrap();
    assert_eq!(active.len(), 1, "{active:?}");
    assert_eq!(active[0].0.task, "Partition 0");
    assert_eq!(active[0].0.gc_grace_secs, 86_400);
    let e = sweep_guard(Duration::from_secs(60), None, &active, true)
        .expect_err("a forced short sweep beside a live upload is refused");
    assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
    backup.close().await.unwrap();
    assert!(active_writers(h.store.as_ref(), &job, SystemClock.now())
        .await
        .unwrap()
        .is_empty());

    // A manual backup: its lease lives only while it runs.
    drop(db);
    let manual = blobsnap::blob::manual::backup(
        Arc::clone(&h.store),
        &spec.dir,
        "lease-check",
        None,
        |_| (),
    )
    .await
    .unwrap();
    assert!(!manual.marker.to_string().is_empty());
    let writers = list_all(
        h.store.as_ref(),
        &JobScope::manual("lease-check")
            .unwrap()
            .all_writers()
            .unwrap(),
    )
    .await
    .unwrap();
    assert!(
        writers.is_empty(),
        "the lease went with the backup: {writers:?}"
    );
}

/// An orphan younger than the grace is kept; one older is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_respects_the_grace_period() {
    use blobsnap::blob::gc::{execute_sweep, plan_sweep, SweepSettings};
    let h = support::local().await;
    let root = match &h.kind {
        support::Kind::Local(l) => l.root().to_path_buf(),
        support::Kind::S3(_) => unreachable!(),
    };
    let ctx = task(&h);
    let tmp = tempfile::tempdir().unwrap();
    let spec = StoreSpec {
        name: "counts".into(),
        dir: tmp.path().join("counts"),
    };
    let backup = BlobBackupManager::new(
        Arc::clone(&h.store),
        ctx.clone(),
        std::slice::from_ref(&spec),
        Arc::new(SystemClock),
        BackupSettings {
            // The exact set of aged keys is the subject (a lease is never swept).
            writer_lease: false,
            ..Default::default()
        },
    )
    .unwrap();
    backup.init(None).await.unwrap();
    let db = RocksStore::open("counts", &spec.dir).unwrap();
    write_keys(&db, 0, 500, 1);
    // An upload whose checkpoint is never written: orphans.
    let id = "1000-0".parse().unwrap();
    db.checkpoint_to(&spec.checkpoint_dir(id)).unwrap();
    backup
        .upload(
            id,
            &Default::default(),
            &BTreeMap::from([("counts".into(), spec.checkpoint_dir(id))]),
        )
        .await
        .unwrap();
    let settings = SweepSettings {
        job_name: ctx.job_name.clone(),
        job_id: "1".into(),
        task: None,
        store: None,
        grace: std::time::Duration::from_secs(3600),
    };
    let plan = plan_sweep(&h.store, &settings).await.unwrap();
    assert!(plan.delete.is_empty(), "young orphans are kept: {plan:?}");
    assert!(plan.kept_young > 0);
    // Age the orphans by two hours.
    let scope = JobScope::new(&ctx.job_name, "1").unwrap();
    let orphans: Vec<_> = list_all(h.store.as_ref(), scope.scope()).await.unwrap();
    let two_hours_ago = blobsnap::backend::Clock::now(&blobsnap::backend::SystemClock)
        - std::time::Duration::from_secs(7200);
    for m in &orphans {
        std::fs::File::options()
            .write(true)
            .open(root.join(m.key.as_str()))
            .unwrap()
            .set_modified(two_hours_ago)
            .unwrap();
    }
    // A fresh orphan, uploaded now.
    write_keys(&db, 500, 500, 2);
    let id2 = "2000-0".parse().unwrap();
    db.checkpoint_to(&spec.checkpoint_dir(id2)).unwrap();
    backup
        .upload(
            id2,
            &Default::default(),
            &BTreeMap::from([("counts".into(), spec.checkpoint_dir(id2))]),
        )
        .await
        .unwrap();
    let plan = plan_sweep(&h.store, &settings).await.unwrap();
    let planned: BTreeSet<String> = plan.delete.iter().map(|d| d.key.clone()).collect();
    let aged: BTreeSet<String> = orphans.iter().map(|m| m.key.as_str().to_string()).collect();
    assert_eq!(planned, aged, "exactly the aged orphans");
    // `gc --dry-run`'s plan writes nothing, not even the clock probe, and plans the same.
    let counting = blobsnap::blobstore::counting::CountingStore::new(
        blobsnap::blobstore::local::LocalStore::new(&root).unwrap(),
    );
    let counters = counting.counters();
    let counting: Arc<dyn blobsnap::blobstore::BlobStore> = Arc::new(counting);
    let dry = blobsnap::blob::gc::plan_sweep_read_only(&counting, &settings)
        .await
        .unwrap();
    let dry_planned: BTreeSet<String> = dry.delete.iter().map(|d| d.key.clone()).collect();
    assert_eq!(dry_planned, aged, "the dry run plans the same");
    let c = counters.snapshot();
    assert_eq!(
        (c.put.calls, c.delete.calls),
        (0, 0),
        "a dry run writes nothing: {c:?}"
    );
    plan_sweep(&counting, &settings).await.unwrap();
    assert_eq!(
        counters.snapshot().put.calls,
        1,
        "a real plan probes the server's clock"
    );
    assert_eq!(
        execute_sweep(h.store.as_ref(), &plan).await.unwrap(),
        aged.len() as u64
    );
    let left = list_all(h.store.as_ref(), scope.scope()).await.unwrap();
    assert!(!left.is_empty(), "the fresh orphan is still there");
    assert!(left.iter().all(|m| !aged.contains(m.key.as_str())));
}

/// The runtime's commit policy: with slow uploads, commits that come due while one is in
/// flight are skipped (processing goes on), with a max delay of zero they wait instead; the
/// scheduled sweep runs between commits; the counts are right either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_uploads_skip_commits_and_counts_stay_right() {
    use blobsnap::blobstore::fault::{FaultConfig, FaultStore};
    use blobsnap::job::{wordcount, JobSettings};
    for max_delay_ms in [60_000u64, 0] {
        let tmp = tempfile::tempdir().unwrap();
        let local = blobsnap::blobstore::local::LocalStore::new(tmp.path().join("store")).unwrap();
        let slow: Arc<dyn BlobStore> = Arc::new(FaultStore::new(
            local,
            FaultConfig {
                latency: std::time::Duration::from_millis(15),
                ..Default::default()
            },
        ));
        let settings = JobSettings {
            job_name: "wordcount".into(),
            job_id: "1".into(),
            state_dir: tmp.path().join("state"),
            input_dir: tmp.path().join("input"),
            stream: "lines".into(),
            partitions: 2,
            stores: vec!["counts".into()],
            commit_every: 50,
            commit_interval: std::time::Duration::ZERO,
            retention: 2,
            unsafe_no_fencing: false,
            commit_max_delay: std::time::Duration::from_millis(max_delay_ms),
            sweep_every_commits: 1,
            gc_grace: std::time::Duration::from_secs(3600),
            restore_fallback: false,
            deployment_id: "test".into(),
            create_resources: true,
            index_inline_below: blobsnap::blob::backup::INLINE_BELOW,
            restore_mode: blobsnap::job::RestoreMode::Full,
            lazy_download_rate: blobsnap::local::lazy::DEFAULT_RATE,
            pre_upload: true,
            start_from: None,
            start_from_id: None,
            retention_tiers: Vec::new(),
            stop: Default::default(),
        };
        wordcount::generate_input(&settings.input_dir, 2, 1500, 5).unwrap();
        let observer: Arc<blobsnap::job::CommitObserver> = Arc::new(|_, _, _| {});
        let admin = blobsnap::blob::admin::BlobStoreAdmin::new(
            Arc::clone(&slow),
            None,
            "wordcount",
            "1",
            "test",
        )
        .unwrap()
        .with_gc_grace(settings.gc_grace);
        let summaries = wordcount::run(&settings, slow, &admin, Arc::new(SystemClock), observer)
            .await
            .unwrap();
        let skipped: u64 = summaries.iter().map(|s| s.commits_skipped).sum();
        let sweeps: u64 = summaries.iter().map(|s| s.sweeps).sum();
        if max_delay_ms > 0 {
            assert!(
                skipped > 0,
                "slow uploads must make commits come due while one is in flight"
            );
        }
        assert!(sweeps > 0, "the scheduled sweep ran");
        assert!(summaries.iter().all(|s| s.commits_failed == 0));
        assert_eq!(
            wordcount::count_stores(&settings.state_dir, 2).unwrap(),
            wordcount::count_input(&settings.input_dir, 2).unwrap()
        );
    }
}

/// Two real processes running the same job against the same store: the later claim fences
/// the earlier one off (it stops with exit code 6, `Conflict`), the survivor ends with the
/// right counts, and the committed history has exactly one writer per sequence number.
/// Then a sweep with grace 0 leaves exactly what the retained checkpoints reference (the
/// zombie's uploads are gone, nothing either process committed is), and a third process on
/// a fresh host restores the survivor's state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_one_job_the_zombie_stops_with_conflict() {
    let tmp = tempfile::tempdir().unwrap();
    let store_dir = tmp.path().join("store");
    let store: Arc<dyn BlobStore> =
        Arc::new(blobsnap::blobstore::local::LocalStore::new(&store_dir).unwrap());
    let store_args = vec!["--local".into(), store_dir.into_os_string()];
    two_process_zombie_case(store, store_args, vec![], 40_000).await;
}

/// Two processes of one job on the same host and the same `--dir`: the second must not restore
/// under the first one's open databases (it would swap the store dirs under them). It is
/// refused with exit code 6 naming the store-dir lock, before it claims anything, and the
/// first one runs to the end with the right counts; a restart on that dir then resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_on_one_dir_the_second_is_refused() {
    let bin = env!("CARGO_BIN_EXE_blobsnap");
    let tmp = tempfile::tempdir().unwrap();
    let store_dir = tmp.path().join("store");
    let store: Arc<dyn BlobStore> =
        Arc::new(blobsnap::blobstore::local::LocalStore::new(&store_dir).unwrap());
    let demo = || {
        let mut cmd = tokio::process::Command::new(bin);
        cmd.arg("--json")
            .arg("--local")
            .arg(&store_dir)
            .args(["demo", "--dir"])
            .arg(tmp.path().join("a"))
            .args([
                "--partitions",
                "2",
                "--lines",
                "40000",
                "--commit-every",
                "200",
            ]);
        cmd
    };
    let cps =
        BlobCheckpointStore::new(Arc::clone(&store), JobScope::new("wordcount", "1").unwrap());
    // The first is held right after its first checkpoint write (BLOBSNAP_HOLD_AT): it has
    // its databases open and runs, by construction, while the second is tried.
    let go = tmp.path().join("go");
    let mut first = demo()
        .kill_on_drop(true)
        .env("BLOBSNAP_HOLD_AT", "commit.after-checkpoint")
        .env("BLOBSNAP_HOLD_UNTIL", &go)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let first_err = wait_for_hold(&mut first, "commit.after-checkpoint").await;
    let second = demo().output().await.unwrap();
    assert!(
        first.try_wait().unwrap().is_none(),
        "the first process, held, still runs"
    );
    let err = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(6), "{err}");
    // The message names the holder: its pid and command.
    let pid = first.id().unwrap();
    assert!(
        err.contains(&format!("in use by pid {pid} (")) && err.contains(" demo "),
        "{err}"
    );
    std::fs::write(&go, b"").unwrap();
    let mut a = first.wait_with_output().await.unwrap();
    a.stderr = first_err.await.unwrap().into_bytes();
    demo_counts_ok(&a);
    // The refused process claimed nothing: every checkpoint of both tasks is the first's
    // (one writer per task, the one of its latest checkpoint).
    for t in ["Partition 0", "Partition 1"] {
        let writer = cps.latest(t).await.unwrap().expect("committed").writer;
        let history = cps.history(t, usize::MAX).await.unwrap();
        assert!(
            history.iter().all(|c| c.writer == writer),
            "{t}: a checkpoint of another writer: {history:?}"
        );
    }
    demo_counts_ok(&demo().output().await.unwrap());
}

/// Read `child`'s stderr until it reports reaching hold point `point`; fails if it ends first.
/// Returns a task that collects the rest of its stderr (the whole log, for the checks after).
async fn wait_for_hold(
    child: &mut tokio::process::Child,
    point: &str,
) -> tokio::task::JoinHandle<String> {
    use tokio::io::AsyncBufReadExt as _;
    let mut err = tokio::io::BufReader::new(child.stderr.take().expect("stderr piped"));
    let mut log = String::new();
    loop {
        let mut line = String::new();
        let n = err.read_line(&mut line).await.unwrap();
        assert!(n > 0, "the process ended before it reached {point}: {log}");
        log.push_str(&line);
        if line.contains(&format!("hold point {point} reached")) {
            break;
        }
    }
    tokio::spawn(async move {
        use tokio::io::AsyncReadExt as _;
        let mut rest = String::new();
        let _ = err.read_to_string(&mut rest).await;
        log + &rest
    })
}

/// The body of the two-process zombie case, on any store that enforces create-only writes:
/// `store_args` are the CLI's global store flags, `envs` its environment (credentials),
/// `store` a handle on the same place for the checks.
async fn two_process_zombie_case(
    store: Arc<dyn BlobStore>,
    store_args: Vec<std::ffi::OsString>,
    envs: Vec<(String, String)>,
    lines: u32,
) {
    let bin = env!("CARGO_BIN_EXE_blobsnap");
    let tmp = tempfile::tempdir().unwrap();
    let lines = lines.to_string();
    let cli = |args: &[&str]| {
        let mut cmd = tokio::process::Command::new(bin);
        cmd.arg("--json")
            .args(&store_args)
            .args(args)
            .envs(envs.iter().map(|(k, v)| (k, v)));
        cmd
    };
    let demo = |dir: &str| {
        let mut cmd = cli(&["demo", "--dir"]);
        cmd.arg(tmp.path().join(dir)).args([
            "--partitions",
            "2",
            "--lines",
            &lines,
            "--commit-every",
            "200",
        ]);
        cmd
    };
    let job_scope = JobScope::new("wordcount", "1").unwrap();
    let cps = BlobCheckpointStore::new(Arc::clone(&store), job_scope.clone());
    // The same generated input for both (same parameters, same seed). The first holds right
    // after its first checkpoint write; the second starts then; the first goes on once the
    // second has claimed both tasks (their latest checkpoints are no longer the first's).
    // Events, not timing, make the first a zombie.
    let go = tmp.path().join("go");
    let mut first = demo("a")
        .kill_on_drop(true)
        .env("BLOBSNAP_HOLD_AT", "commit.after-checkpoint")
        .env("BLOBSNAP_HOLD_UNTIL", &go)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first_err = tokio::io::BufReader::new(first.stderr.take().unwrap());
    let mut first_log = String::new();
    loop {
        use tokio::io::AsyncBufReadExt as _;
        let mut line = String::new();
        let n = first_err.read_line(&mut line).await.unwrap();
        assert!(
            n > 0,
            "the first process ended before its first commit: {first_log}"
        );
        first_log.push_str(&line);
        if line.contains("hold point commit.after-checkpoint reached") {
            break;
        }
    }
    let drain = tokio::spawn(async move {
        use tokio::io::AsyncReadExt as _;
        let mut rest = String::new();
        let _ = first_err.read_to_string(&mut rest).await;
        first_log + &rest
    });
    // The first's writers: each task's claim is its first checkpoint (wait for both claims;
    // the task not held may still be starting).
    let mut firsts = BTreeSet::new();
    for t in ["Partition 0", "Partition 1"] {
        let c = loop {
            if let Some(c) = cps.history(t, usize::MAX).await.unwrap().pop() {
                break c;
            }
            assert!(
                first.try_wait().unwrap().is_none(),
                "the first ended before claiming {t}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        };
        firsts.insert(c.writer);
    }
    let second = tokio::spawn(demo("b").output());
    'claimed: loop {
        for t in ["Partition 0", "Partition 1"] {
            let latest = cps.latest(t).await.unwrap();
            if latest.is_none_or(|c| firsts.contains(&c.writer)) {
                assert!(
                    !second.is_finished(),
                    "the second process ended before it claimed {t}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                continue 'claimed;
            }
        }
        break;
    }
    std::fs::write(&go, b"go").unwrap();
    let a = first.wait().await.unwrap();
    let a_err = drain.await.unwrap();
    let b = second.await.unwrap().unwrap();
    let a = std::process::Output {
        status: a,
        stdout: Vec::new(),
        stderr: a_err.into_bytes(),
    };
    assert_eq!(
        a.status.code(),
        Some(6),
        "the zombie stops with Conflict: {}",
        String::from_utf8_lossy(&a.stderr)
    );
    assert!(
        String::from_utf8_lossy(&a.stderr).contains("fenced"),
        "{}",
        String::from_utf8_lossy(&a.stderr)
    );
    demo_counts_ok(&b);
    // One writer per sequence number, and the latest is the survivor's.
    for t in ["Partition 0", "Partition 1"] {
        let hist = cps.history(t, usize::MAX).await.unwrap();
        let seqs: BTreeSet<u64> = hist.iter().map(|c| c.seq).collect();
        assert_eq!(seqs.len(), hist.len());
    }

    // Neither process's cleanup deleted what the other's committed index needs; the
    // zombie's uploads are swept.
    let swept = sweep_leaves_exactly_the_referenced(cli(&[]), &store, 2, "zombie case").await;
    eprintln!("zombie case: {swept} orphans swept");
    // A new host restores the survivor's committed state and ends right.
    demo_counts_ok(&demo("c").output().await.unwrap());
}

/// Commits also come by time (`--commit-ms`), and `[job]` settings come from the TOML file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_by_time_and_job_settings_from_toml() {
    let bin = env!("CARGO_BIN_EXE_blobsnap");
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("job.toml");
    std::fs::write(
        &config,
        "[job]\npartitions = 3\ncommit-every = 100000000\ncommit-ms = 1\n",
    )
    .unwrap();
    let out = tokio::process::Command::new(bin)
        .args(["--json", "--config"])
        .arg(&config)
        .args(["--local"])
        .arg(tmp.path().join("store"))
        .args(["demo", "--dir"])
        .arg(tmp.path().join("d"))
        .args(["--lines", "3000"])
        .output()
        .await
        .unwrap();
    let v = demo_counts_ok(&out);
    let tasks = v["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 3, "partitions from the TOML file");
    assert!(
        tasks.iter().all(|t| t["commits"].as_u64().unwrap() > 1),
        "commits by time: {v}"
    );
}

/// A store added to a job that already committed: it has no snapshot, starts empty, and is
/// committed from then on; crashes right after adding it recover like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adding_a_store_then_crashing_recovers() {
    let bin = env!("CARGO_BIN_EXE_blobsnap");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d");
    let demo = |stores: &str| {
        let mut cmd = tokio::process::Command::new(bin);
        cmd.args(["--json", "demo", "--dir"]).arg(&dir).args([
            "--partitions",
            "2",
            "--lines",
            "8000",
            "--commit-every",
            "300",
            "--stores",
            stores,
        ]);
        cmd
    };
    kill_when_held(demo("counts"), "commit.after-checkpoint").await;
    for point in ["task.after-restore", "commit.after-checkpoint"] {
        let out = demo("counts,lengths")
            .env("BLOBSNAP_CRASH_AT", point)
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success() || out.status.signal() == Some(9),
            "{point}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let v = demo_counts_ok(&demo("counts,lengths").output().await.unwrap());
    // The added store's content, too: each partition's word lengths from the offset its store
    // started at (after the first commit: the demo was held there and killed) to the end.
    assert_eq!(v["lengths-check"], "ok", "{v}");
    use blobsnap::job::wordcount::{check_lengths, LENGTHS_FROM_KEY};
    let (state, input) = (dir.join("state"), dir.join("input"));
    let mut starts = Vec::new();
    for p in 0..2 {
        let lengths =
            blobsnap::job::store_dir(&state, "lengths", &blobsnap::job::task_name(p)).unwrap();
        let db = RocksStore::open("lengths", &lengths).unwrap();
        let from = db.db().get(LENGTHS_FROM_KEY.as_bytes()).unwrap();
        starts.push(u64::from_le_bytes(from.unwrap().try_into().unwrap()));
    }
    assert!(
        starts.iter().any(|&s| s > 0),
        "the store was added mid-input: {starts:?}"
    );
    // The check has teeth: one length counted once more is a mismatch.
    let (stored, expected) = check_lengths(&state, &input, 2).unwrap();
    assert_eq!(stored, expected);
    {
        let lengths =
            blobsnap::job::store_dir(&state, "lengths", &blobsnap::job::task_name(0)).unwrap();
        let db = RocksStore::open("lengths", &lengths).unwrap();
        let (k, v) = db
            .db()
            .iterator(rocksdb::IteratorMode::Start)
            .next()
            .unwrap()
            .unwrap();
        let n = u64::from_le_bytes((*v).try_into().unwrap());
        db.db().put(&k, (n + 1).to_le_bytes()).unwrap();
    }
    let (stored, expected) = check_lengths(&state, &input, 2).unwrap();
    assert_ne!(stored, expected, "a changed count is found");
    let store: Arc<dyn BlobStore> =
        Arc::new(blobsnap::blobstore::local::LocalStore::new(dir.join("store")).unwrap());
    let cps = BlobCheckpointStore::new(store, JobScope::new("wordcount", "1").unwrap());
    for t in ["Partition 0", "Partition 1"] {
        let latest = cps.latest(t).await.unwrap().unwrap();
        let markers = &latest.checkpoint.as_v2().unwrap().state_checkpoint_markers[FACTORY_NAME];
        assert!(
            markers.contains_key("counts") && markers.contains_key("lengths"),
            "{t}: {markers:?}"
        );
    }
}

/// Corruption of the last checkpoint's snapshot — a flipped byte in one of its blobs, or its
/// index deleted — is detected (exit 4 `Corrupt` / 3 `NotFound`) and nothing is installed into
/// the store dir; with `--restore-fallback` the job restores the newest retained checkpoint
/// that does restore, says so loudly, resumes from *its* offsets, and ends with the right
/// counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_last_snapshot_is_detected_and_fallback_restores_an_older_one() {
    use blobsnap::blobstore::{get_bytes, PutBody, PutOptions};
    for damage in ["flip a byte of a blob", "delete the index"] {
        let tmp = tempfile::tempdir().unwrap();
        let bin = env!("CARGO_BIN_EXE_blobsnap");
        let demo = |extra: &[&str]| {
            let mut c = std::process::Command::new(bin);
            c.arg("--json")
                .arg("demo")
                .arg("--dir")
                .arg(tmp.path())
                .args([
                    "--partitions",
                    "1",
                    "--lines",
                    "3000",
                    "--commit-every",
                    "400",
                ])
                .args(extra);
            c.output().unwrap()
        };
        let first = demo_counts_ok(&demo(&[]));
        let store: Arc<dyn BlobStore> = Arc::new(
            blobsnap::blobstore::local::LocalStore::new(tmp.path().join("store")).unwrap(),
        );
        let scope = JobScope::new("wordcount", "1").unwrap();
        let cps = BlobCheckpointStore::new(Arc::clone(&store), scope.clone());
        let task = "Partition 0";
        let history = cps.history(task, usize::MAX).await.unwrap();
        let marker_of = |c: &blobsnap::checkpoint::CommittedCheckpoint| {
            c.checkpoint.as_v2().unwrap().state_checkpoint_markers[FACTORY_NAME]["counts"].clone()
        };
        let latest = marker_of(&history[0]);
        let older = history
            .iter()
            .map(marker_of)
            .find(|m| *m != latest)
            .expect("an older retained snapshot");
        let ctx = TaskContext {
            job_name: "wordcount".into(),
            job_id: "1".into(),
            task_name: task.into(),
        };
        let sscope = scope.store(task, "counts").unwrap();
        match damage {
            "flip a byte of a blob" => {
                let old_idx = support::index_of(store.as_ref(), &ctx, &older).await;
                let old_blobs: BTreeSet<String> = old_idx
                    .present_files()
                    .into_iter()
                    .flat_map(|(_, f)| f.blobs.iter().map(|b| b.blob_id.clone()))
                    .collect();
                let idx = support::index_of(store.as_ref(), &ctx, &latest).await;
                let (_, f) = idx
                    .present_files()
                    .into_iter()
                    .filter(|(_, f)| {
                        f.blobs
                            .first()
                            .is_some_and(|b| f.size() > 0 && !old_blobs.contains(&b.blob_id))
                    })
                    .max_by_key(|(_, f)| f.size())
                    .expect("a blob only the latest snapshot has");
                let key = sscope.key(&f.blobs[0].blob_id).unwrap();
                let mut bytes = get_bytes(store.as_ref(), &key, 1 << 30)
                    .await
                    .unwrap()
                    .to_vec();
                let at = bytes.len() / 2;
                bytes[at] ^= 0x5a;
                store
                    .put(&key, PutBody::Bytes(bytes.into()), PutOptions::default())
                    .await
                    .unwrap();
            }
            _ => {
                let key = sscope.key(&latest).unwrap();
                assert!(store.delete_many(&[key]).await.unwrap().is_empty());
            }
        }
        // A fresh machine: no local state.
        let state = tmp.path().join("state");
        std::fs::remove_dir_all(&state).unwrap();

        let out = demo(&[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let want = if damage.starts_with("flip") { 4 } else { 3 };
        assert_eq!(out.status.code(), Some(want), "{damage}: {stderr}");
        // The failure says how to go on (issue 51, item 11).
        assert!(
            stderr.contains("To go on:")
                && stderr.contains("--restore-fallback")
                && stderr.contains("check --job wordcount --job-id 1 --read-data"),
            "{damage}: {stderr}"
        );
        let store_dir = state.join("counts").join("Partition_0");
        let installed = std::fs::read_dir(&store_dir)
            .map(|d| {
                d.flatten()
                    .any(|e| e.path().extension().is_some_and(|x| x == "sst"))
            })
            .unwrap_or(false);
        assert!(
            !installed,
            "{damage}: nothing may be installed into {store_dir:?}"
        );

        let out = demo(&["--restore-fallback"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let v = demo_counts_ok(&out);
        assert!(
            stderr.contains("RESTORE FALLBACK"),
            "{damage}: loud: {stderr}"
        );
        let t = &v["tasks"][0];
        assert!(t["fell-back-to"].is_string(), "{damage}: {v}");
        // Resumed from the older checkpoint's offset (restored: > 0), so the last messages
        // were processed again (> 0) — the newest checkpoint was at the end of the input.
        assert!(t["resumed-from"].as_u64().unwrap() > 0, "{damage}: {v}");
        // Exactly the offset of the checkpoint it names.
        let fell_to = t["fell-back-to"].as_str().unwrap();
        let restored = history
            .iter()
            .find(|c| {
                fell_to.split(' ').next() == Some(&c.checkpoint.as_v2().unwrap().id.to_string())
            })
            .unwrap_or_else(|| panic!("{damage}: {fell_to} is not in the history"));
        assert_ne!(marker_of(restored), latest, "{damage}: an older snapshot");
        assert_eq!(
            t["resumed-from"].as_u64(),
            restored.checkpoint.offsets()[&Ssp::new("files", "lines", 0)]
                .parse::<u64>()
                .ok(),
            "{damage}: resumed from the fallback checkpoint's own offset: {v}"
        );
        assert_eq!(first["tasks"][0]["processed"], 3000, "{first}");
        assert!(t["processed"].as_u64().unwrap() > 0, "{damage}: {v}");
    }
}

/// The runtime's settings for the library-level job tests: one partition, `stores`, a commit
/// every 400 messages, retention 2, the store at `<tmp>/store`.
/// One transfer budget for the whole process: two tasks of one job, on one store handle with
/// a budget of 2, commit and restore with never more than 2 transfers in flight on the store
/// below it — and 2 at once do happen (the bound binds). Then the same job on a budget of
/// 1 (its restore included): one transfer at a time across both tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tasks_share_one_transfer_budget() {
    use blobsnap::blobstore::limit::{Budget, LimitStore};
    for size in [2usize, 1] {
        let tmp = tempfile::tempdir().unwrap();
        // Budget 2: the first transfers wait until two are in flight, so the peak of 2 is
        // reached by construction (and a budget letting 3 through would show 3).
        let gauge = Arc::new(if size == 2 {
            support::InFlight::meeting(2)
        } else {
            support::InFlight::default()
        });
        let measured = support::Hooked::measured(
            Arc::new(
                blobsnap::blobstore::local::LocalStore::new(tmp.path().join("store")).unwrap(),
            ),
            Arc::clone(&gauge),
        );
        let store: Arc<dyn BlobStore> = Arc::new(LimitStore::new(measured, Budget::new(size)));
        let mut settings = job_settings(tmp.path(), &["counts", "lengths"], false);
        settings.partitions = 2;
        blobsnap::job::wordcount::generate_input(&settings.input_dir, 2, 2000, 7).unwrap();
        let first = run_job(&settings, Arc::clone(&store)).await.unwrap();
        assert_eq!(first.len(), 2);
        assert!(first.iter().all(|t| t.commits > 0), "{first:?}");
        // A new host: both tasks restore both stores through the same budget.
        std::fs::remove_dir_all(&settings.state_dir).unwrap();
        blobsnap::job::wordcount::generate_input(&settings.input_dir, 2, 2400, 7).unwrap();
        run_job(&settings, Arc::clone(&store)).await.unwrap();
        // Both stores hold the right content: the words, and the word lengths from the start.
        let wc = &blobsnap::job::wordcount::count_stores(&settings.state_dir, 2);
        assert_eq!(
            wc.as_ref().unwrap(),
            &blobsnap::job::wordcount::count_input(&settings.input_dir, 2).unwrap()
        );
        let (stored, expected) =
            blobsnap::job::wordcount::check_lengths(&settings.state_dir, &settings.input_dir, 2)
                .unwrap();
        assert!(!stored.is_empty());
        assert_eq!(stored, expected, "the lengths store");
        assert!(gauge.transfers() > 50, "{} transfers", gauge.transfers());
        assert_eq!(
            gauge.peak(),
            size,
            "budget {size}: at most {size} transfers at once across both tasks, and that many happen"
        );
    }
}

fn job_settings(
    tmp: &std::path::Path,
    stores: &[&str],
    fallback: bool,
) -> blobsnap::job::JobSettings {
    blobsnap::job::JobSettings {
        job_name: "wordcount".into(),
        job_id: "1".into(),
        state_dir: tmp.join("state"),
        input_dir: tmp.join("input"),
        stream: "lines".into(),
        partitions: 1,
        stores: stores.iter().map(|s| s.to_string()).collect(),
        commit_every: 400,
        commit_interval: std::time::Duration::ZERO,
        retention: 2,
        unsafe_no_fencing: false,
        commit_max_delay: std::time::Duration::from_secs(60),
        sweep_every_commits: 0,
        gc_grace: std::time::Duration::from_secs(3600),
        restore_fallback: fallback,
        deployment_id: "test".into(),
        create_resources: true,
        index_inline_below: blobsnap::blob::backup::INLINE_BELOW,
        restore_mode: blobsnap::job::RestoreMode::Full,
        lazy_download_rate: blobsnap::local::lazy::DEFAULT_RATE,
        pre_upload: true,
        start_from: None,
        start_from_id: None,
        retention_tiers: Vec::new(),
        stop: Default::default(),
    }
}

/// Run the word-count job of `settings` on `store` to the end of its input.
async fn run_job(
    settings: &blobsnap::job::JobSettings,
    store: Arc<dyn BlobStore>,
) -> blobsnap::Result<Vec<blobsnap::job::TaskSummary>> {
    run_job_observed(settings, store, Arc::new(|_, _, _| {})).await
}

/// [`run_job`], with `observer` called after every commit.
async fn run_job_observed(
    settings: &blobsnap::job::JobSettings,
    store: Arc<dyn BlobStore>,
    observer: Arc<blobsnap::job::CommitObserver>,
) -> blobsnap::Result<Vec<blobsnap::job::TaskSummary>> {
    let admin = blobsnap::blob::admin::BlobStoreAdmin::new(
        Arc::clone(&store),
        None,
        &settings.job_name,
        &settings.job_id,
        &settings.deployment_id,
    )?
    .with_gc_grace(settings.gc_grace);
    blobsnap::job::wordcount::run(settings, store, &admin, Arc::new(SystemClock), observer).await
}

fn lines_offset(text: &str, lines: usize) -> u64 {
    text.split_inclusive('\n')
        .take(lines)
        .map(str::len)
        .sum::<usize>() as u64
}

fn word_counts(text: &str) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for w in text.split_whitespace() {
        *counts.entry(w.to_string()).or_insert(0) += 1;
    }
    counts
}

/// The restore fallback is for a snapshot that is gone or corrupt, never for a store that is
/// merely unreachable or refuses us: a transient error (503 after the retries) or a
/// permission error (403) on the last checkpoint's index stops the task with that error and
/// commits nothing; the same failure as `NotFound` (the control) falls back and resumes from
/// exactly the older checkpoint's offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_or_permission_error_never_triggers_the_fallback() {
    use blobsnap::blobstore::local::LocalStore;
    let tmp = tempfile::tempdir().unwrap();
    let settings = job_settings(tmp.path(), &["counts"], true);
    blobsnap::job::wordcount::generate_input(&settings.input_dir, 1, 3000, 3).unwrap();
    let store: Arc<dyn BlobStore> = Arc::new(LocalStore::new(tmp.path().join("store")).unwrap());
    run_job(&settings, Arc::clone(&store)).await.unwrap();
    let cps =
        BlobCheckpointStore::new(Arc::clone(&store), JobScope::new("wordcount", "1").unwrap());
    let task = "Partition 0";
    let history = cps.history(task, usize::MAX).await.unwrap();
    let latest = history[0].checkpoint.as_v2().unwrap().clone();
    let latest_marker = latest.state_checkpoint_markers[FACTORY_NAME]["counts"].clone();
    let older = history
        .iter()
        .filter_map(|c| c.checkpoint.as_v2())
        .find(|c| c.state_checkpoint_markers[FACTORY_NAME]["counts"] != latest_marker)
        .expect("an older retained checkpoint")
        .clone();
    let ssp = Ssp::new("files", "lines", 0);

    for (kind, what) in [
        (ErrorKind::Transient, "503 SlowDown after 3 attempts"),
        (ErrorKind::Permanent, "403 AccessDenied"),
        (ErrorKind::NotFound, "404 NoSuchKey"),
    ] {
        // A fresh host: the restore must read the index.
        let _ = std::fs::remove_dir_all(&settings.state_dir);
        let needle = latest_marker.clone();
        let hooked: Arc<dyn BlobStore> = Arc::new(support::Hooked::new(
            Arc::clone(&store),
            Box::new(move |key, _| {
                key.as_str()
                    .ends_with(&needle)
                    .then(|| blobsnap::Error::new(kind, format!("get {key}: {what} (injected)")))
            }),
        ));
        let r = run_job(&settings, hooked).await;
        let now = cps.latest(task).await.unwrap().unwrap();
        match kind {
            ErrorKind::NotFound => {
                let s = r.expect("a missing index falls back");
                let fell = s[0].fell_back_to.as_deref().expect("fell back");
                assert!(fell.starts_with(&older.id.to_string()), "{fell}");
                assert_eq!(
                    Some(s[0].resumed_from),
                    older.input_offsets[&ssp].parse().ok(),
                    "resumed from exactly the older checkpoint's offset"
                );
                assert_eq!(
                    blobsnap::job::wordcount::count_stores(&settings.state_dir, 1).unwrap(),
                    blobsnap::job::wordcount::count_input(&settings.input_dir, 1).unwrap()
                );
            }
            _ => {
                let e = r.expect_err(what);
                assert_eq!(e.kind(), kind, "{what}: {e}");
                assert!(e.to_string().contains("(injected)"), "{what}: {e}");
                // No fallback commit: the latest checkpoint is still the same id and offsets
                // (the claim repeats it under a new number).
                let v2 = now.checkpoint.as_v2().unwrap();
                assert_eq!(v2.id, latest.id, "{what}: nothing committed");
                assert_eq!(v2.input_offsets, latest.input_offsets, "{what}");
            }
        }
    }
}

/// A sweep of a busy job completes (N10 of the second protocol review): a task's writer trims
/// a checkpoint document between the sweep's listing of the history and its read of that
/// document (simulated: the first GET of the oldest document answers NotFound, as after the
/// trim); the history is listed and read again instead of the whole sweep failing closed. A
/// document that stays unreadable still fails it (the control).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trim_racing_the_sweeps_history_read_is_read_again() {
    use blobsnap::blobstore::local::LocalStore;
    let tmp = tempfile::tempdir().unwrap();
    let settings = job_settings(tmp.path(), &["counts"], false);
    blobsnap::job::wordcount::generate_input(&settings.input_dir, 1, 2000, 8).unwrap();
    let store: Arc<dyn BlobStore> = Arc::new(LocalStore::new(tmp.path().join("store")).unwrap());
    run_job(&settings, Arc::clone(&store)).await.unwrap();
    let job = JobScope::new("wordcount", "1").unwrap();
    let oldest = list_all(store.as_ref(), &job.checkpoints("Partition 0").unwrap())
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.key)
        .min_by(|a, b| a.as_str().cmp(b.as_str()))
        .unwrap();
    let sweep = blobsnap::blob::gc::SweepSettings {
        job_name: "wordcount".into(),
        job_id: "1".into(),
        task: None,
        store: None,
        grace: std::time::Duration::from_secs(3600),
    };
    for always in [false, true] {
        let missed = std::sync::atomic::AtomicU64::new(0);
        let key = oldest.clone();
        let hooked: Arc<dyn BlobStore> = Arc::new(support::Hooked::new(
            Arc::clone(&store),
            Box::new(move |k, _| {
                (*k == key
                    && (always || missed.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0))
                    .then(|| {
                        blobsnap::Error::new(
                            ErrorKind::NotFound,
                            format!("{k}: trimmed (injected)"),
                        )
                    })
            }),
        ));
        let r = blobsnap::blob::gc::plan_sweep(&hooked, &sweep).await;
        if always {
            let e = r.expect_err("a document that stays missing fails the sweep closed");
            assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
        } else {
            let plan = r.expect("the history is read again");
            assert!(plan.roots >= 1, "{plan:?}");
        }
    }
}

/// A job run once on a local store at `root` (1 partition, 3000 lines, fallback on), and an
/// SST only its latest snapshot holds: the two newest checkpoints, the file and its blob.
struct LatestOnlySst {
    settings: blobsnap::job::JobSettings,
    store: Arc<dyn BlobStore>,
    job: JobScope,
    cps: BlobCheckpointStore,
    task: &'static str,
    latest: blobsnap::checkpoint::CheckpointV2,
    older: blobsnap::checkpoint::CheckpointV2,
    file: String,
    blob: String,
}

async fn latest_only_sst(tmp: &std::path::Path, root: &std::path::Path) -> LatestOnlySst {
    use blobsnap::blobstore::local::LocalStore;
    let settings = job_settings(tmp, &["counts"], true);
    blobsnap::job::wordcount::generate_input(&settings.input_dir, 1, 3000, 4).unwrap();
    let store: Arc<dyn BlobStore> = Arc::new(LocalStore::new(root).unwrap());
    run_job(&settings, Arc::clone(&store)).await.unwrap();
    let job = JobScope::new("wordcount", "1").unwrap();
    let cps = BlobCheckpointStore::new(Arc::clone(&store), job.clone());
    let task = "Partition 0";
    let history = cps.history(task, usize::MAX).await.unwrap();
    let latest = history[0].checkpoint.as_v2().unwrap().clone();
    let older = history[1].checkpoint.as_v2().unwrap().clone();
    let ctx = blobsnap::backend::TaskContext {
        job_name: "wordcount".into(),
        job_id: "1".into(),
        task_name: task.into(),
    };
    let marker = |c: &blobsnap::checkpoint::CheckpointV2| {
        c.state_checkpoint_markers[FACTORY_NAME]["counts"].clone()
    };
    let new_idx = support::index_of(store.as_ref(), &ctx, &marker(&latest)).await;
    let old_idx = support::index_of(store.as_ref(), &ctx, &marker(&older)).await;
    let old_blobs: BTreeSet<String> = old_idx
        .present_files()
        .into_iter()
        .flat_map(|(_, f)| f.blobs.iter().map(|b| b.blob_id.clone()))
        .collect();
    let (file, blob) = new_idx
        .present_files()
        .into_iter()
        .filter(|(n, f)| n.ends_with(".sst") && f.inline_data.is_none())
        .find_map(|(n, f)| {
            let b = &f.blobs.first()?.blob_id;
            (!old_blobs.contains(b)).then(|| (n, b.clone()))
        })
        .expect("an SST only the latest snapshot has");
    LatestOnlySst {
        settings,
        store,
        job,
        cps,
        task,
        latest,
        older,
        file,
        blob,
    }
}

/// A lazy restore takes the restore fallback like a full one (F3 of the lazy-restore review):
/// the latest snapshot names an SST whose blob is gone; the restore proves every remote blob
/// before it reports success, so the missing one is `NotFound` at restore time, the task
/// falls back to the older checkpoint (resuming from exactly its offset) and ends with the
/// input's counts. Without the fallback, the same restore stops the task with `NotFound`
/// naming the file, committing nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_restore_of_a_missing_blob_takes_the_fallback() {
    let tmp = tempfile::tempdir().unwrap();
    let j = latest_only_sst(tmp.path(), &tmp.path().join("store")).await;
    let (mut settings, store, job, cps, task) = (j.settings, j.store, j.job, j.cps, j.task);
    let (latest, older, gone_file, gone_blob) = (j.latest, j.older, j.file, j.blob);
    let key = job.store(task, "counts").unwrap().key(&gone_blob).unwrap();
    store.delete_many(std::slice::from_ref(&key)).await.unwrap();
    settings.restore_mode = blobsnap::job::RestoreMode::Lazy;
    let ssp = Ssp::new("files", "lines", 0);

    // Without the fallback: NotFound at restore, naming the file; nothing committed.
    settings.restore_fallback = false;
    let _ = std::fs::remove_dir_all(&settings.state_dir);
    let e = run_job(&settings, Arc::clone(&store)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert!(e.to_string().contains(&gone_file), "names the file: {e}");
    let now = cps.latest(task).await.unwrap().unwrap();
    assert_eq!(
        now.checkpoint.as_v2().unwrap().id,
        latest.id,
        "nothing committed"
    );

    // With it: the task falls back to the older checkpoint and resumes from its offset.
    settings.restore_fallback = true;
    let _ = std::fs::remove_dir_all(&settings.state_dir);
    let s = run_job(&settings, Arc::clone(&store)).await.unwrap();
    let fell = s[0].fell_back_to.as_deref().expect("fell back");
    assert!(fell.starts_with(&older.id.to_string()), "{fell}");
    assert_eq!(
        Some(s[0].resumed_from),
        older.input_offsets[&ssp].parse().ok(),
        "resumed from exactly the older checkpoint's offset"
    );
    assert_eq!(
        blobsnap::job::wordcount::count_stores(&settings.state_dir, 1).unwrap(),
        blobsnap::job::wordcount::count_input(&settings.input_dir, 1).unwrap()
    );
}

/// A lazily restored store whose blob is corrupt with its size intact (issue 46, L4: the
/// restore's HEAD cannot see it) does not crash-loop: the background download fails the file
/// for good and leaves a durable note (`LAZY-FAILED`) in the store dir; the next start's
/// restore downloads and verifies that file before the store opens, so the bad blob fails the
/// restore with `Corrupt` naming the file (nothing committed), and with the restore fallback
/// the task falls back to the older checkpoint, resumes from exactly its offset and ends with
/// the input's counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_restore_of_a_corrupt_blob_of_the_right_size_takes_the_fallback_at_the_next_start() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("store");
    let j = latest_only_sst(tmp.path(), &root).await;
    let (mut settings, store, job, cps, task) = (j.settings, j.store, j.job, j.cps, j.task);
    let (older, bad_file, bad_blob) = (j.older, j.file, j.blob);
    let key = job.store(task, "counts").unwrap().key(&bad_blob).unwrap();
    let path = root.join(key.as_str());
    let mut bytes = std::fs::read(&path).unwrap();
    let len = bytes.len();
    bytes[len / 2] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
    settings.restore_mode = blobsnap::job::RestoreMode::Lazy;
    settings.restore_fallback = false;
    let ssp = Ssp::new("files", "lines", 0);

    // The first lazy start: the restore's HEAD passes (same size); the background download
    // fails the file for good, and the note names it.
    let _ = std::fs::remove_dir_all(&settings.state_dir);
    let _ = run_job(&settings, Arc::clone(&store)).await;
    let store_dir = settings.state_dir.join("Partition 0").join("counts");
    let dirs: Vec<std::path::PathBuf> = walk_files(&settings.state_dir)
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n == "LAZY-FAILED"))
        .collect();
    assert_eq!(
        dirs.len(),
        1,
        "one note: {dirs:?} (store dir {})",
        store_dir.display()
    );
    let note = std::fs::read_to_string(&dirs[0]).unwrap();
    assert!(
        note.contains(&bad_file) && note.contains(&bad_blob),
        "{note}"
    );

    // The next start without the fallback: the restore fails Corrupt naming the file, and
    // nothing is committed.
    let before = cps.latest(task).await.unwrap().unwrap();
    let e = run_job(&settings, Arc::clone(&store)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
    assert!(e.to_string().contains(&bad_file), "names the file: {e}");
    let now = cps.latest(task).await.unwrap().unwrap();
    assert_eq!(
        now.checkpoint.as_v2().unwrap().id,
        before.checkpoint.as_v2().unwrap().id,
        "nothing committed (the claim repeats the latest)"
    );

    // With it: the task falls back to the older checkpoint and resumes from its offset.
    settings.restore_fallback = true;
    let s = run_job(&settings, Arc::clone(&store)).await.unwrap();
    let fell = s[0].fell_back_to.as_deref().expect("fell back");
    assert!(fell.starts_with(&older.id.to_string()), "{fell}");
    assert_eq!(
        Some(s[0].resumed_from),
        older.input_offsets[&ssp].parse().ok(),
        "resumed from exactly the older checkpoint's offset"
    );
    assert_eq!(
        blobsnap::job::wordcount::count_stores(&settings.state_dir, 1).unwrap(),
        blobsnap::job::wordcount::count_input(&settings.input_dir, 1).unwrap()
    );
}

/// Every file under `dir`.
fn walk_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// A start-from point is never fallen back from (issue 46, S4-6): a rollback whose head does
/// not restore (its index is gone) stops the task with `NotFound` even with the restore
/// fallback on — the fallback used to restore the pre-rollback latest silently, and the
/// record, already "applied", never let the rollback be retried. Every later start (with the
/// same start-from, or none) stops the same way; nothing is committed past the head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_from_head_that_fails_to_restore_is_never_fallen_back_from() {
    use blobsnap::blobstore::local::LocalStore;
    let tmp = tempfile::tempdir().unwrap();
    let mut settings = job_settings(tmp.path(), &["counts"], true);
    blobsnap::job::wordcount::generate_input(&settings.input_dir, 1, 3000, 4).unwrap();
    let store: Arc<dyn BlobStore> = Arc::new(LocalStore::new(tmp.path().join("store")).unwrap());
    run_job(&settings, Arc::clone(&store)).await.unwrap();
    let job = JobScope::new("wordcount", "1").unwrap();
    let cps = BlobCheckpointStore::new(Arc::clone(&store), job.clone());
    let task = "Partition 0";
    let history = cps.history(task, usize::MAX).await.unwrap();
    let (latest, older) = (&history[0], &history[1]);
    let marker = |c: &blobsnap::checkpoint::CheckpointV2| {
        c.state_checkpoint_markers[FACTORY_NAME]["counts"].clone()
    };
    let (older_marker, latest_marker) = (
        marker(older.checkpoint.as_v2().unwrap()),
        marker(latest.checkpoint.as_v2().unwrap()),
    );
    assert_ne!(older_marker, latest_marker);
    let key = job
        .store(task, "counts")
        .unwrap()
        .key(&older_marker)
        .unwrap();
    store.delete_many(std::slice::from_ref(&key)).await.unwrap();

    settings.start_from = Some(blobsnap::blob::history::CheckpointRef::Seq(older.seq));
    for start_from in [true, true, false] {
        if !start_from {
            settings.start_from = None;
        }
        let _ = std::fs::remove_dir_all(&settings.state_dir);
        let e = run_job(&settings, Arc::clone(&store)).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
        assert!(e.to_string().contains("never fallen back from"), "{e}");
        let now = cps.latest(task).await.unwrap().unwrap();
        assert_eq!(
            now.checkpoint.as_v2().unwrap().id,
            older.checkpoint.as_v2().unwrap().id,
            "the head stays the rollback's: nothing restored or committed past it"
        );
    }
}

/// A task whose last checkpoint is a CheckpointV1 (a job migrating from a changelog backend,
/// Samza's shape: input offsets mixed with a changelog position): the runtime resumes from
/// the V1 input offset with empty stores (V1 names no snapshot), and its first commit is a
/// CheckpointV2 with blobsnap's markers whose snapshot holds exactly the words after that
/// offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v1_checkpoint_migrates_through_the_runtime() {
    use blobsnap::blobstore::local::LocalStore;
    use blobsnap::checkpoint::{Checkpoint, CheckpointV1};
    let tmp = tempfile::tempdir().unwrap();
    let settings = job_settings(tmp.path(), &["counts"], false);
    blobsnap::job::wordcount::generate_input(&settings.input_dir, 1, 2000, 9).unwrap();
    let text = std::fs::read_to_string(settings.input_dir.join("0.txt")).unwrap();
    let from = lines_offset(&text, 700);
    let store: Arc<dyn BlobStore> = Arc::new(LocalStore::new(tmp.path().join("store")).unwrap());
    let cps =
        BlobCheckpointStore::new(Arc::clone(&store), JobScope::new("wordcount", "1").unwrap());
    let ssp = Ssp::new("files", "lines", 0);
    let v1 = Checkpoint::V1(CheckpointV1 {
        offsets: BTreeMap::from([
            (ssp.clone(), from.to_string()),
            (
                Ssp::new("kafka", "wordcount-counts-changelog", 0),
                "5123".into(),
            ),
        ]),
    });
    cps.write("Partition 0", 1, "samza-v1", &v1).await.unwrap();

    let s = run_job(&settings, Arc::clone(&store)).await.unwrap();
    assert_eq!(s[0].resumed_from, from, "resumed from the V1 input offset");
    assert_eq!(s[0].processed, 2000 - 700);
    let latest = cps.latest("Partition 0").await.unwrap().unwrap();
    let v2 = latest.checkpoint.as_v2().expect("the first commit is a V2");
    assert_eq!(v2.input_offsets[&ssp], text.len().to_string());
    assert!(v2.state_checkpoint_markers[FACTORY_NAME].contains_key("counts"));
    // The store counts exactly the words after the V1 offset: it started empty.
    let want = word_counts(&text[from as usize..]);
    assert_eq!(
        blobsnap::job::wordcount::count_stores(&settings.state_dir, 1).unwrap(),
        want
    );
    // And the V2 snapshot restores to that on a fresh host.
    std::fs::remove_dir_all(&settings.state_dir).unwrap();
    let s = run_job(&settings, Arc::clone(&store)).await.unwrap();
    assert_eq!(s[0].resumed_from, text.len() as u64);
    assert_eq!(
        blobsnap::job::wordcount::count_stores(&settings.state_dir, 1).unwrap(),
        want
    );
}

/// A store removed from the job's configuration: the job keeps running without it; its
/// snapshots stay while a retained checkpoint names them (a sweep with grace 0 keeps them and
/// they still restore), and once retention has moved past them the sweep deletes them — the
/// bucket then holds exactly what the retained checkpoints reference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_store_is_kept_while_retained_then_swept() {
    use blobsnap::blob::gc::{execute_sweep, plan_sweep, SweepSettings};
    use blobsnap::blobstore::local::LocalStore;
    use std::io::Write as _;
    let tmp = tempfile::tempdir().unwrap();
    let both = job_settings(tmp.path(), &["counts", "lengths"], false);
    blobsnap::job::wordcount::generate_input(&both.input_dir, 1, 2000, 4).unwrap();
    let store: Arc<dyn BlobStore> = Arc::new(LocalStore::new(tmp.path().join("store")).unwrap());
    run_job(&both, Arc::clone(&store)).await.unwrap();
    let cps =
        BlobCheckpointStore::new(Arc::clone(&store), JobScope::new("wordcount", "1").unwrap());
    let names_lengths = |c: &blobsnap::checkpoint::CommittedCheckpoint| {
        c.checkpoint
            .as_v2()
            .is_some_and(|v| v.state_checkpoint_markers[FACTORY_NAME].contains_key("lengths"))
    };
    let lengths_marker = cps
        .latest("Partition 0")
        .await
        .unwrap()
        .unwrap()
        .checkpoint
        .as_v2()
        .unwrap()
        .state_checkpoint_markers[FACTORY_NAME]["lengths"]
        .clone();
    let input = both.input_dir.join("0.txt");
    let append = |lines: usize| {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&input)
            .unwrap();
        for i in 0..lines {
            writeln!(f, "appended words number {i}").unwrap();
        }
    };
    let sweep = || {
        let store = Arc::clone(&store);
        async move {
            let plan = plan_sweep(
                &store,
                &SweepSettings {
                    job_name: "wordcount".into(),
                    job_id: "1".into(),
                    task: None,
                    store: None,
                    grace: std::time::Duration::ZERO,
                },
            )
            .await
            .unwrap();
            execute_sweep(store.as_ref(), &plan).await.unwrap()
        }
    };
    let lengths_keys = || async {
        job_keys(store.as_ref())
            .await
            .into_iter()
            .filter(|k| k.contains("/stores/lengths/"))
            .count()
    };

    // Removed: one more commit (fewer new lines than commit-every: the final commit).
    let counts_only = job_settings(tmp.path(), &["counts"], false);
    append(100);
    let s = run_job(&counts_only, Arc::clone(&store)).await.unwrap();
    assert_eq!(s[0].processed, 100);
    let history = cps.history("Partition 0", usize::MAX).await.unwrap();
    assert!(
        !names_lengths(&history[0]),
        "the new checkpoint has no lengths marker"
    );
    assert!(
        history.iter().any(names_lengths),
        "a retained checkpoint still names the removed store"
    );
    sweep().await;
    assert_eq!(
        job_keys(store.as_ref()).await,
        support::referenced(&store, "wordcount", 1).await
    );
    assert!(
        lengths_keys().await > 0,
        "the removed store's retained snapshot was kept"
    );
    // It still restores.
    let ctx = TaskContext {
        job_name: "wordcount".into(),
        job_id: "1".into(),
        task_name: "Partition 0".into(),
    };
    let spec = StoreSpec {
        name: "lengths".into(),
        dir: tmp.path().join("lengths-back"),
    };
    let r = blobsnap::blob::restore::BlobRestoreManager::new(
        Arc::clone(&store),
        ctx,
        std::slice::from_ref(&spec),
        Default::default(),
    )
    .unwrap();
    let older = history.iter().find(|c| names_lengths(c)).unwrap();
    assert_eq!(
        older.checkpoint.as_v2().unwrap().state_checkpoint_markers[FACTORY_NAME]["lengths"],
        lengths_marker
    );
    use blobsnap::backend::TaskRestoreManager as _;
    r.init(Some(&older.checkpoint)).await.unwrap();
    r.restore().await.unwrap();
    assert!(RocksStore::open("lengths", &spec.dir).is_ok());

    // Retention moves past it: two more commits; the sweep deletes the removed store's objects.
    for _ in 0..2 {
        append(100);
        run_job(&counts_only, Arc::clone(&store)).await.unwrap();
    }
    let history = cps.history("Partition 0", usize::MAX).await.unwrap();
    assert!(
        !history.iter().any(names_lengths),
        "retention moved past the removed store"
    );
    sweep().await;
    assert_eq!(
        job_keys(store.as_ref()).await,
        support::referenced(&store, "wordcount", 1).await
    );
    assert_eq!(
        lengths_keys().await,
        0,
        "the removed store's objects were swept"
    );
    assert_eq!(
        blobsnap::job::wordcount::count_stores(&counts_only.state_dir, 1).unwrap(),
        blobsnap::job::wordcount::count_input(&counts_only.input_dir, 1).unwrap()
    );
}

/// The sweep's clock is the server's: with the server's clock 2 h behind or 2 h ahead of this
/// machine's (every LastModified it reports shifted so), a grace of 1 h keeps the orphans
/// written just now and deletes those written 3 h ago, exactly. A cutoff taken from this
/// machine's clock (what `gc --dry-run` uses, documented as skew-sensitive) would delete the
/// fresh orphans of the server that is behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_uses_the_servers_clock_not_this_machines() {
    use blobsnap::blob::gc::{plan_sweep, plan_sweep_read_only, SweepSettings};
    use blobsnap::blobstore::{PutBody, PutOptions};
    use std::time::Duration;
    let hour = Duration::from_secs(3600);
    for (what, ahead) in [("server 2 h behind", false), ("server 2 h ahead", true)] {
        let h = support::local().await;
        let root = match &h.kind {
            support::Kind::Local(l) => l.root().to_path_buf(),
            support::Kind::S3(_) => unreachable!(),
        };
        let ctx = task(&h);
        let sscope = JobScope::new(&ctx.job_name, "1")
            .unwrap()
            .store(&ctx.task_name, "counts")
            .unwrap();
        let orphan = |i: u32| sscope.key(&format!("blobs/1000-0/{:064x}", i)).unwrap();
        let (old, fresh) = (
            (0..3).map(orphan).collect::<Vec<_>>(),
            (3..6).map(orphan).collect::<Vec<_>>(),
        );
        for k in old.iter().chain(&fresh) {
            h.store
                .put(
                    k,
                    PutBody::Bytes(b"orphan".to_vec().into()),
                    PutOptions::default(),
                )
                .await
                .unwrap();
        }
        let three_hours_ago =
            blobsnap::backend::Clock::now(&blobsnap::backend::SystemClock) - 3 * hour;
        for k in &old {
            std::fs::File::options()
                .write(true)
                .open(root.join(k.as_str()))
                .unwrap()
                .set_modified(three_hours_ago)
                .unwrap();
        }
        let skew = 2 * hour;
        let server: Arc<dyn BlobStore> = Arc::new(
            support::Hooked::new(Arc::clone(&h.store), Box::new(|_, _| None)).with_meta(Box::new(
                move |mut m| {
                    m.last_modified = m
                        .last_modified
                        .map(|t| if ahead { t + skew } else { t - skew });
                    m
                },
            )),
        );
        let settings = SweepSettings {
            job_name: ctx.job_name.clone(),
            job_id: "1".into(),
            task: None,
            store: None,
            grace: hour,
        };
        let plan = plan_sweep(&server, &settings).await.unwrap();
        let planned: BTreeSet<String> = plan.delete.iter().map(|d| d.key.clone()).collect();
        let want: BTreeSet<String> = old.iter().map(|k| k.as_str().to_string()).collect();
        assert_eq!(planned, want, "{what}: exactly the orphans 3 h old");
        assert_eq!(plan.kept_young as usize, fresh.len(), "{what}");
        if !ahead {
            let by_ours = plan_sweep_read_only(&server, &settings).await.unwrap();
            assert_eq!(
                by_ours.delete.len(),
                old.len() + fresh.len(),
                "{what}: this machine's clock would take the fresh orphans for 2 h old"
            );
        }
    }
}

/// What a commit costs in requests (issue 19 §1), counted below the job on the local store:
/// per store, the PUTs its upload reports (one per new blob, one for the index; none for an
/// unchanged store); per task, on top, the checkpoint PUT and one batch delete, which trims
/// the checkpoint history (what this process wrote and retention let go, reading nothing:
/// only a process's first trim lists the history) and deletes the snapshots of every store
/// that left retention at the commit before. Nothing is read while the task runs; after the
/// job exactly the retained snapshots' objects remain (the last commit's deletes are sent as
/// the task stops).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_costs_its_uploads_one_checkpoint_put_and_the_cleanup() {
    use blobsnap::blobstore::local::LocalStore;
    use std::sync::Mutex;
    let tmp = tempfile::tempdir().unwrap();
    let counting = CountingStore::new(Arc::new(LocalStore::new(tmp.path().join("store")).unwrap()));
    let counters = counting.counters();
    let store: Arc<dyn BlobStore> = Arc::new(counting);
    let mut settings = job_settings(tmp.path(), &["counts", "lengths"], false);
    // A commit that comes due while one is in flight waits for it instead of being skipped:
    // exactly one commit per 400 messages, whatever the machine's speed.
    settings.commit_max_delay = std::time::Duration::ZERO;
    // The commit's own requests: no pre-upload PUTs between commits (counted apart in
    // tests/it/preupload.rs).
    settings.pre_upload = false;
    blobsnap::job::wordcount::generate_input(&settings.input_dir, 1, 4000, 11).unwrap();
    // At each commit: the counters now and the PUTs the stores' uploads reported.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let observer: Arc<blobsnap::job::CommitObserver> = Arc::new({
        let (seen, counters) = (Arc::clone(&seen), Arc::clone(&counters));
        move |_, _, backup| {
            let uploads: u64 = backup.last_upload().values().map(|u| u.requests).sum();
            seen.lock().unwrap().push((counters.snapshot(), uploads));
        }
    });
    run_job_observed(&settings, Arc::clone(&store), observer)
        .await
        .unwrap();
    // The trims that read nothing kept exactly the retained checkpoints.
    let cps =
        BlobCheckpointStore::new(Arc::clone(&store), JobScope::new("wordcount", "1").unwrap());
    let history = cps.history("Partition 0", usize::MAX).await.unwrap();
    let ids: BTreeSet<String> = history
        .iter()
        .map(|c| c.checkpoint.as_v2().unwrap().id.to_string())
        .collect();
    assert_eq!(ids.len(), settings.retention, "{history:?}");
    assert!(history.len() <= settings.retention + 1, "{history:?}");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 10, "4,000 messages, a commit every 400");
    // From the fourth commit on, retention (2) is full: every commit also expires one.
    for (i, w) in seen.windows(2).enumerate().skip(2) {
        let ((before, _), (after, uploads)) = (w[0], w[1]);
        let d = after.since(&before);
        assert_eq!(
            d.put.calls,
            uploads + 1,
            "commit {}: the uploads' PUTs and the checkpoint's: {d:?}",
            i + 2
        );
        assert_eq!(
            d.delete.calls,
            1,
            "commit {}: one batch, the trim's and the last cleanup's: {d:?}",
            i + 2
        );
        assert_eq!(
            (d.get.calls, d.head.calls, d.list.calls),
            (0, 0, 1),
            "commit {}: nothing read while the task runs but the LIST of the job's savepoints that goes with the batch delete (none: no index read): {d:?}",
            i + 2
        );
    }
    let deletes: u64 = seen
        .windows(2)
        .skip(2)
        .map(|w| w[1].0.since(&w[0].0).delete.calls)
        .sum();
    assert!(deletes > 0, "cleanup deleted something");
}

/// `blobsnap cost`'s estimate, read from the retained checkpoints and indexes, against the
/// counting layer's real requests and bytes of the same run: PUTs and upload bytes per task
/// commit within 10 %; the monthly figures follow from them at the list prices.
#[tokio::test]
async fn the_cost_estimate_matches_the_counted_requests() {
    use blobsnap::blob::cost::{estimate, CostOptions, Prices};
    use blobsnap::blobstore::local::LocalStore;
    use std::sync::Mutex;
    let tmp = tempfile::tempdir().unwrap();
    let counting = CountingStore::new(Arc::new(LocalStore::new(tmp.path().join("store")).unwrap()));
    let counters = counting.counters();
    let store: Arc<dyn BlobStore> = Arc::new(counting);
    let mut settings = job_settings(tmp.path(), &["counts", "lengths"], false);
    // Every commit retained, so every commit is sampled; none skipped (a commit due while
    // one is in flight waits for it), so their number does not depend on the machine's speed.
    settings.retention = 100;
    settings.commit_max_delay = std::time::Duration::ZERO;
    blobsnap::job::wordcount::generate_input(&settings.input_dir, 1, 6000, 11).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let observer: Arc<blobsnap::job::CommitObserver> = Arc::new({
        let (seen, counters) = (Arc::clone(&seen), Arc::clone(&counters));
        move |_, _, _| seen.lock().unwrap().push(counters.snapshot())
    });
    run_job_observed(&settings, Arc::clone(&store), observer)
        .await
        .unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 15, "6,000 messages, a commit every 400");
    // Commits 2..n: what each cost beyond the one before it (the first uploads everything).
    let commits = (seen.len() - 1) as f64;
    let (puts, bytes) = seen.windows(2).fold((0u64, 0u64), |(p, b), w| {
        let d = w[1].since(&w[0]);
        (p + d.put.calls, b + d.put.bytes)
    });
    let (puts, bytes) = (puts as f64 / commits, bytes as f64 / commits);

    let report = estimate(
        &store,
        &CostOptions {
            job_name: settings.job_name.clone(),
            job_id: settings.job_id.clone(),
            commit_interval: Some(std::time::Duration::from_secs(60)),
            multipart_threshold: u64::MAX,
            part_size: 0,
            sweep_every_commits: 0,
            retention_tiers: false,
            prices: Prices::default(),
        },
    )
    .await
    .unwrap();
    assert_eq!(report.tasks, 1);
    // Every stored byte is the live snapshots', the window's or the points' metadata.
    assert!(report.retained_points >= 15, "{report:?}");
    assert!(
        report.live_bytes > 0 && report.metadata_bytes > 0,
        "{report:?}"
    );
    assert_eq!(
        report.stored_bytes,
        report.live_bytes + report.window_bytes + report.metadata_bytes,
        "{report:?}"
    );
    assert_eq!(report.sampled_task_commits as f64, commits, "{report:?}");
    let est = report.per_task_commit;
    assert!(
        (est.put - puts).abs() <= 0.10 * puts,
        "estimated {:.2} PUTs per commit, counted {puts:.2}",
        est.put
    );
    assert!(
        (est.upload_bytes - bytes).abs() <= 0.10 * bytes,
        "estimated {:.0} bytes uploaded per commit, counted {bytes:.0}",
        est.upload_bytes
    );
    assert_eq!(
        (est.get, est.list),
        (0.0, 1.0),
        "a running job reads nothing but the LIST of its savepoints before each batch delete"
    );
    // A month of one commit a minute, at $0.005 per 1,000 PUTs and $0.023 per GB-month.
    let m = report.monthly;
    assert!((m.commits - 43_200.0).abs() < 1e-6);
    assert!((m.requests.put - est.put * 43_200.0).abs() < 1e-6);
    let storage = report.stored_bytes as f64 / (1u64 << 30) as f64 * 0.023;
    assert!((m.storage_usd - storage).abs() < 1e-9);
    // PUTs and LISTs are priced alike.
    assert!((m.requests_usd - (m.requests.put + m.requests.list) / 1000.0 * 0.005).abs() < 1e-9);
    // The stored bytes cover at least the newest snapshot's files.
    assert!(report.stored_bytes > 0 && report.stored_objects > commits as u64);
}

/// The streaming sweep (issue 19 §4): every root is loaded before the first delete (no GET
/// after a DeleteObjects), the listing is decided page by page and deleted in batches of
/// 1,000, and the dry run decides exactly what the real run deletes. The retained
/// snapshot still verifies afterwards; an unknown key under `tasks/` is reported, not
/// deleted.
#[tokio::test]
async fn the_sweep_streams_in_batches_after_loading_every_root() {
    use blobsnap::blob::gc::{sweep, Doomed, SweepSettings};
    use blobsnap::blobstore::local::LocalStore;
    use blobsnap::blobstore::{PutBody, PutOptions};
    use blobsnap::id::CheckpointId;
    use blobsnap::layout::StoreScope;
    let tmp = tempfile::tempdir().unwrap();
    let local: Arc<dyn BlobStore> = Arc::new(LocalStore::new(tmp.path().join("store")).unwrap());
    let settings = job_settings(tmp.path(), &["counts"], false);
    blobsnap::job::wordcount::generate_input(&settings.input_dir, 1, 2000, 5).unwrap();
    run_job(&settings, Arc::clone(&local)).await.unwrap();

    // 2,500 orphans of a commit that never happened, and one key of no known shape.
    let job = JobScope::new("wordcount", "1").unwrap();
    let scope = job.store("Partition 0", "counts").unwrap();
    let failed = CheckpointId::new(1_000, 7).unwrap();
    let mut orphans = BTreeSet::new();
    for i in 0..2_500u32 {
        let body = format!("orphan {i}");
        let sha = blobsnap::digest::Sha256::of(body.as_bytes());
        let key = scope.key(&StoreScope::blob_id(failed, sha)).unwrap();
        local
            .put(
                &key,
                PutBody::Bytes(body.into_bytes().into()),
                PutOptions::default(),
            )
            .await
            .unwrap();
        orphans.insert(key.as_str().to_string());
    }
    let stray = job
        .tasks()
        .unwrap()
        .escaped("Partition 0")
        .unwrap()
        .key("notes.txt")
        .unwrap();
    local
        .put(&stray, PutBody::Bytes("mine".into()), PutOptions::default())
        .await
        .unwrap();
    let sweep_settings = SweepSettings {
        job_name: "wordcount".into(),
        job_id: "1".into(),
        task: None,
        store: None,
        grace: std::time::Duration::ZERO,
    };

    let mut planned = Vec::new();
    let dry = sweep(&local, &sweep_settings, true, &mut |d: &Doomed| {
        planned.push(d.key.clone())
    })
    .await
    .unwrap();
    assert_eq!(dry.deleted, 0);
    let planned_set: BTreeSet<String> = planned.iter().cloned().collect();
    assert!(orphans.is_subset(&planned_set), "every orphan is doomed");
    assert_eq!(dry.plan.doomed as usize, planned.len());
    assert_eq!(dry.plan.unknown, vec![stray.as_str().to_string()]);
    assert!(dry.plan.roots >= 2 && dry.plan.live > 0, "{:?}", dry.plan);
    assert!(list_all(local.as_ref(), job.scope()).await.unwrap().len() > 2_500);

    // The real run, on a store that records, at every GET, how many deletes came before.
    let counting = CountingStore::new(Arc::clone(&local));
    let counters = counting.counters();
    let deletes_before_gets = Arc::new(std::sync::Mutex::new(Vec::new()));
    let hooked = support::Hooked::new(
        Arc::new(counting),
        Box::new({
            let (seen, counters) = (Arc::clone(&deletes_before_gets), Arc::clone(&counters));
            move |_, _| {
                seen.lock().unwrap().push(counters.snapshot().delete.calls);
                None
            }
        }),
    );
    let store: Arc<dyn BlobStore> = Arc::new(hooked);
    let mut deleted = Vec::new();
    let real = sweep(&store, &sweep_settings, false, &mut |d: &Doomed| {
        deleted.push(d.key.clone())
    })
    .await
    .unwrap();
    assert_eq!(
        deleted, planned,
        "the dry run decided what the real run deleted"
    );
    assert_eq!(real.deleted as usize, planned.len());
    let gets = deletes_before_gets.lock().unwrap().clone();
    // The owner record's GET comes first (a scope another engine writes is refused before
    // anything is written), then the server-clock probe's delete; no sweep delete before the
    // last root GET.
    assert!(
        gets.len() > 1 && gets[0] == 0 && gets[1..].iter().all(|d| *d == 1),
        "a GET after a sweep delete: {gets:?}"
    );
    let batches = counters.snapshot().delete.calls;
    assert_eq!(
        batches as usize,
        planned.len().div_ceil(1000) + 1,
        "the probe's delete and one per 1,000"
    );
    let left: BTreeSet<String> = list_all(local.as_ref(), job.scope())
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.key.as_str().to_string())
        .collect();
    assert!(left.is_disjoint(&orphans), "every orphan deleted");
    assert!(
        left.contains(stray.as_str()),
        "an unknown key is never deleted"
    );

    // What the task's last checkpoint names is all still there.
    let cps = BlobCheckpointStore::new(Arc::clone(&local), job.clone());
    let latest = cps.latest("Partition 0").await.unwrap().unwrap();
    let marker = latest
        .checkpoint
        .as_v2()
        .unwrap()
        .marker(FACTORY_NAME, "counts")
        .unwrap()
        .to_string();
    let who = blobsnap::blob::Expected {
        job_name: "wordcount",
        job_id: "1",
        task_name: "Partition 0",
        store_name: "counts",
    };
    let snap = blobsnap::blob::load_snapshot(local.as_ref(), &who, &marker)
        .await
        .unwrap();
    let report = blobsnap::blob::verify::verify(
        local.as_ref(),
        &snap,
        &blobsnap::blob::verify::VerifyOptions::default(),
        &std::sync::atomic::AtomicU64::new(0),
    )
    .await
    .unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

/// An unchanged store costs no flush, no RocksDB checkpoint and no read (issue 19 §3): the
/// commit manager hands the backend the store's last checkpoint directory again while its
/// change token (sequence and super-version numbers) has not moved, and the backend carries
/// the marker forward without scanning it. A compaction (no write) or a write moves the token:
/// a new directory is made and scanned, and the checkpoint restores the store's keys, the late
/// write among them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_store_is_not_checkpointed_again_until_it_changes() {
    use blobsnap::backend::TaskRestoreManager as _;
    use blobsnap::blobstore::local::LocalStore;
    let tmp = tempfile::tempdir().unwrap();
    let store: Arc<dyn BlobStore> = Arc::new(LocalStore::new(tmp.path().join("store")).unwrap());
    let ctx = TaskContext {
        job_name: "idle".into(),
        job_id: "1".into(),
        task_name: "Partition 0".into(),
    };
    let specs: Vec<StoreSpec> = ["busy", "idle"]
        .iter()
        .map(|n| StoreSpec {
            name: n.to_string(),
            dir: tmp.path().join(n),
        })
        .collect();
    let busy = Arc::new(RocksStore::open("busy", &specs[0].dir).unwrap());
    let idle = Arc::new(RocksStore::open("idle", &specs[1].dir).unwrap());
    let checkpoints: Arc<dyn CheckpointStore> = Arc::new(BlobCheckpointStore::new(
        Arc::clone(&store),
        JobScope::new("idle", "1").unwrap(),
    ));
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let (mgr, last) = TaskCommitManager::start(
        ctx.clone(),
        Arc::clone(&checkpoints),
        Arc::clone(&clock),
        2,
        false,
    )
    .await
    .unwrap();
    let backup = Arc::new(
        BlobBackupManager::new(
            Arc::clone(&store),
            ctx.clone(),
            &specs,
            Arc::clone(&clock),
            BackupSettings::default(),
        )
        .unwrap(),
    );
    backup.init(last.as_ref()).await.unwrap();
    let mgr = mgr
        .with_stores(vec![
            Arc::clone(&busy) as Arc<dyn StoreEngine>,
            Arc::clone(&idle) as Arc<dyn StoreEngine>,
        ])
        .with_backends(
            vec![Backend {
                name: FACTORY_NAME.into(),
                manager: Arc::clone(&backup) as _,
            }],
            last,
        );
    let mut round = 0u32;
    let mut commit = || {
        round += 1;
        let offsets = BTreeMap::from([(Ssp::new("files", "lines", 0), round.to_string())]);
        let mgr = &mgr;
        async move { mgr.commit(offsets).await.unwrap() }
    };
    let dirs_of = |spec: &StoreSpec| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(spec.checkpoints_dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    let idle_hashed = || backup.last_upload_stats()["idle"].bytes_hashed;
    let marker = |r: &blobsnap::commit::CommitReport, s: &str| {
        r.checkpoint.marker(FACTORY_NAME, s).unwrap().to_string()
    };

    // Two SSTs in the idle store, then a first commit of both.
    write_keys(&idle, 0, 200, 1);
    idle.flush().unwrap();
    write_keys(&idle, 200, 200, 2);
    write_keys(&busy, 0, 200, 3);
    let first = commit().await;
    assert!(idle_hashed() > 0, "the first commit scans the idle store");
    let made = first.checkpoint.id.to_string();
    // Three commits that write to the busy store only: the idle store's directory is the
    // first one each time, nothing of it is read, its marker is carried.
    for i in 0..3 {
        write_keys(&busy, 200 * (i + 1), 200, 4 + u64::from(i));
        let r = commit().await;
        assert_eq!(dirs_of(&specs[1]), vec![made.clone()], "round {i}");
        assert_eq!(
            idle_hashed(),
            0,
            "round {i}: the idle store was not scanned"
        );
        assert_eq!(marker(&r, "idle"), marker(&first, "idle"), "round {i}");
        assert_ne!(marker(&r, "busy"), marker(&first, "busy"), "round {i}");
        assert_eq!(
            dirs_of(&specs[0]),
            vec![r.checkpoint.id.to_string()],
            "round {i}: the busy store gets a new checkpoint"
        );
    }
    // A compaction, no write: a new directory, scanned.
    idle.db().compact_range(None::<&[u8]>, None::<&[u8]>);
    let compacted = commit().await;
    assert_eq!(
        dirs_of(&specs[1]),
        vec![compacted.checkpoint.id.to_string()]
    );
    assert!(idle_hashed() > 0, "the compacted store was scanned");
    // Unchanged again: that directory is reused.
    let again = commit().await;
    assert_eq!(
        dirs_of(&specs[1]),
        vec![compacted.checkpoint.id.to_string()]
    );
    assert_eq!(idle_hashed(), 0);
    assert_eq!(marker(&again, "idle"), marker(&compacted, "idle"));
    // One late write: a new directory, a new marker, and the checkpoint restores it.
    idle.db().put(b"late", b"write").unwrap();
    let late = commit().await;
    assert_eq!(dirs_of(&specs[1]), vec![late.checkpoint.id.to_string()]);
    assert_ne!(marker(&late, "idle"), marker(&again, "idle"));
    let back = StoreSpec {
        name: "idle".into(),
        dir: tmp.path().join("idle-back"),
    };
    let r = blobsnap::blob::restore::BlobRestoreManager::new(
        Arc::clone(&store),
        ctx,
        std::slice::from_ref(&back),
        Default::default(),
    )
    .unwrap();
    r.init(Some(&Checkpoint::V2(late.checkpoint.clone())))
        .await
        .unwrap();
    r.restore().await.unwrap();
    let restored = RocksStore::open("idle", &back.dir).unwrap();
    let keys = |db: &RocksStore| -> Vec<(Vec<u8>, Vec<u8>)> {
        db.db()
            .iterator(rocksdb::IteratorMode::Start)
            .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())).unwrap())
            .collect()
    };
    assert_eq!(keys(&restored), keys(&idle));
    assert_eq!(
        restored.db().get(b"late").unwrap().as_deref(),
        Some(&b"write"[..])
    );
}

/// State through time, end to end through `blobsnap` commands alone (issue 32 §1–3): list
/// every retained checkpoint, save two points (an older one by `#N`, the head by `latest`),
/// roll the demo back to the older one — it commits the point as its new head (same offsets
/// and markers), reprocesses from exactly its offsets and ends with counts equal to an
/// independent count — while its cleanup and a forced `gc` keep everything both savepoints
/// name; run on past the saved head, then start from it: the task resumes from exactly the
/// head's offsets (not the latest's), and the savepoint restores the head's state; refuse a point
/// the task no longer has, naming the task, committing nothing; and after `savepoint rm`, `gc`
/// takes what only that savepoint kept.
async fn state_through_time(ms: &MatrixStore, root: &std::path::Path) {
    let leg = ms.leg(root, "history").await;
    let dir = root.join("demo");
    let d = dir.display().to_string();
    let run = |args: Vec<String>| {
        let mut c = leg.cmd(&args);
        async move { c.output().await.unwrap() }
    };
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    // Retention 3 keeps an older point to roll back to; the runs after the first keep 1, so
    // that every commit's cleanup lets the previous snapshot go — savepoints must hold theirs.
    // The input: 3000 lines, extended to 3600 before the roll forward (so that the latest
    // state is not the saved head's).
    let input_lines = std::cell::Cell::new("3000");
    let demo = |extra: &[&str]| {
        let keep = if extra.is_empty() { "3" } else { "1" };
        let mut a = s(&[
            "demo",
            "--dir",
            &d,
            "--partitions",
            "1",
            "--lines",
            input_lines.get(),
            "--commit-every",
            "300",
            "--retention",
            keep,
        ]);
        a.extend(leg.extra.iter().cloned());
        a.extend(s(extra));
        a
    };
    let json = |out: &std::process::Output| -> serde_json::Value {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    demo_counts_ok(&run(demo(&[])).await);
    let list = json(&run(s(&["checkpoints", "--job", "wordcount"])).await);
    let lines = list["tasks"]["Partition 0"].as_array().unwrap().clone();
    assert!(lines.len() >= 3, "{list}");
    // Newest first; the oldest retained is the rollback target.
    let head = &lines[0];
    let old = lines.last().unwrap();
    let old_seq = old["seq"].as_u64().unwrap();
    let old_offset = old["input-offsets"]["files.lines.0"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(
        old_offset,
        head["input-offsets"]["files.lines.0"].as_str().unwrap(),
        "{list}"
    );
    for (name, at) in [
        ("old", format!("#{old_seq}")),
        ("head", "latest".to_string()),
    ] {
        let v = json(
            &run(s(&[
                "savepoint",
                "create",
                "--job",
                "wordcount",
                "--name",
                name,
                "--at",
                &at,
            ]))
            .await,
        );
        assert_eq!(v["savepoint"]["name"], name, "{v}");
    }
    let ls = json(&run(s(&["savepoint", "ls", "--job", "wordcount"])).await);
    assert_eq!(ls["savepoints"].as_array().unwrap().len(), 2, "{ls}");
    // A name is taken once.
    let again = run(s(&[
        "savepoint",
        "create",
        "--job",
        "wordcount",
        "--name",
        "old",
    ]))
    .await;
    assert_eq!(
        again.status.code(),
        Some(6),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );

    // Roll back.
    let v = demo_counts_ok(&run(demo(&["--start-from", "savepoint:old"])).await);
    assert_eq!(
        v["tasks"][0]["resumed-from"]
            .as_u64()
            .map(|o| o.to_string()),
        Some(old_offset.clone()),
        "reprocessed from the savepoint's offsets: {v}"
    );
    let after = json(&run(s(&["checkpoints", "--job", "wordcount"])).await);
    let moved = after["tasks"]["Partition 0"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["checkpoint-id"] == old["checkpoint-id"] && l["seq"].as_u64() > Some(old_seq))
        .cloned();
    // The move itself may have left retention already; the savepoint still names the point.
    if let Some(m) = moved {
        assert_eq!(m["input-offsets"], old["input-offsets"], "{after}");
        // Labelled as the rollback's head, not as a claim, and not pinned: the savepoint
        // pins the checkpoint it recorded, by number.
        assert_eq!(m["start-from"], "savepoint:old", "{after}");
        assert_eq!(m["repeats"], serde_json::Value::Null, "{after}");
        assert!(
            !m["savepoints"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s == "old"),
            "{after}"
        );
    }
    // Everything both savepoints name survived the cleanup of the rollback's commits, and a
    // forced sweep with no grace.
    let gc = s(&["gc", "--job", "wordcount", "--grace-secs", "0", "--force"]);
    for swept in [false, true] {
        if swept {
            json(&run(gc.clone()).await);
        }
        for sp in ["savepoint:old", "savepoint:head"] {
            let out = run(s(&[
                "verify",
                "--job",
                "wordcount",
                "--task",
                "Partition 0",
                "--store",
                "counts",
                sp,
            ]))
            .await;
            assert!(
                out.status.success(),
                "{sp} (after gc: {swept}): {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    // A second run with the same start-from resumes from the latest (applied once).
    let v = demo_counts_ok(&run(demo(&["--start-from", "savepoint:old"])).await);
    assert_eq!(v["tasks"][0]["processed"].as_u64(), Some(0), "{v}");

    // Run on past the head (a longer input), so that the latest state is not the head's.
    input_lines.set("3600");
    let v = demo_counts_ok(&run(demo(&[])).await);
    assert_eq!(v["tasks"][0]["processed"].as_u64(), Some(600), "{v}");
    // Roll forward (here: back) to the saved head: the task resumes from exactly the head's
    // offsets — not the latest's — and reprocesses the 600 lines after it.
    let head_offset = head["input-offsets"]["files.lines.0"]
        .as_str()
        .unwrap()
        .to_string();
    let v = demo_counts_ok(&run(demo(&["--start-from", "savepoint:head"])).await);
    assert_eq!(
        v["tasks"][0]["resumed-from"]
            .as_u64()
            .map(|o| o.to_string()),
        Some(head_offset),
        "resumed from the saved head's offsets: {v}"
    );
    assert_eq!(v["tasks"][0]["processed"].as_u64(), Some(600), "{v}");
    // The head's own state comes back key for key from its savepoint, and differs from the
    // state now (which holds the 600 lines after it).
    let restored = root.join("r-head");
    let out = run(s(&[
        "restore",
        "--job",
        "wordcount",
        "--task",
        "Partition 0",
        "--store",
        "counts",
        "--to",
        &restored.display().to_string(),
        "savepoint:head",
    ]))
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let state = blobsnap::job::store_dir(&dir.join("state"), "counts", "Partition 0").unwrap();
    let keys = |p: &std::path::Path| {
        let db = RocksStore::open("counts", p).unwrap();
        db.db()
            .iterator(rocksdb::IteratorMode::Start)
            .map(|kv| kv.unwrap())
            .collect::<Vec<_>>()
    };
    assert_ne!(
        keys(&state),
        keys(&restored),
        "the state now holds the lines after the head"
    );

    // A point the task no longer has: refused before anything starts, naming the task.
    let before = json(&run(s(&["checkpoints", "--job", "wordcount"])).await);
    let out = run(demo(&["--start-from", "#1"])).await;
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Partition 0") && err.contains("#1"), "{err}");
    let now = json(&run(s(&["checkpoints", "--job", "wordcount"])).await);
    assert_eq!(before["tasks"], now["tasks"], "nothing committed");

    // Remove a savepoint: the sweep takes what only it kept.
    let pinned = json(&run(s(&["usage", "--job", "wordcount", "--grace-secs", "0"])).await);
    let only = &pinned["usage"]["classes"]["savepoints-only"];
    assert!(
        only["objects"].as_u64() > Some(0),
        "what only savepoint old keeps: {pinned}"
    );
    json(
        &run(s(&[
            "savepoint",
            "rm",
            "--job",
            "wordcount",
            "--name",
            "old",
        ]))
        .await,
    );
    // `usage` sees what only the removed savepoint kept as a leak (no grace), and every
    // object in exactly one class; the sweep then takes exactly the leak.
    let usage = |v: &serde_json::Value, class: &str| -> (u64, u64) {
        let c = &v["usage"]["classes"][class];
        (c["objects"].as_u64().unwrap(), c["bytes"].as_u64().unwrap())
    };
    let u = json(&run(s(&["usage", "--job", "wordcount", "--grace-secs", "0"])).await);
    let leak = usage(&u, "orphans-past-grace");
    assert!(leak.0 > 0, "{u}");
    assert!(
        usage(&u, "live").0 > 0 && usage(&u, "metadata").0 > 0,
        "{u}"
    );
    let classes: u64 = [
        "live",
        "savepoints-only",
        "orphans-within-grace",
        "orphans-past-grace",
        "metadata",
        "unknown",
    ]
    .iter()
    .map(|c| usage(&u, c).0)
    .sum();
    assert_eq!(Some(classes), u["usage"]["total-objects"].as_u64(), "{u}");
    let swept = json(&run(gc.clone()).await);
    assert_eq!(
        swept["deleted"].as_u64(),
        Some(leak.0),
        "the sweep took the leak: {swept} {u}"
    );
    let u = json(&run(s(&["usage", "--job", "wordcount", "--grace-secs", "0"])).await);
    assert_eq!(usage(&u, "orphans-past-grace"), (0, 0), "{u}");

    // The whole-job check: clean (read and hashed); then the index a root names goes
    // missing: `check` names it and every root that names it (exit 3) where `gc` only fails
    // closed.
    let check = |extra: &[&str]| {
        let mut a = s(&["check", "--job", "wordcount"]);
        a.extend(s(extra));
        a
    };
    let c = json(&run(check(&["--read-data"])).await);
    assert!(c["report"]["blobs-read"].as_u64() > Some(0), "{c}");
    assert_eq!(c["report"]["blobs-read"], c["report"]["blobs"], "{c}");
    assert_eq!(c["report"]["savepoints"].as_u64(), Some(1), "{c}");
    let sp = json(
        &run(s(&[
            "savepoint",
            "show",
            "--job",
            "wordcount",
            "--name",
            "head",
        ]))
        .await,
    );
    let doc = &sp["savepoint"]["tasks"]["Partition 0"]["checkpoint"];
    let marker = doc["state-checkpoint-markers"]["blobsnap.BlobStoreStateBackendFactory"]["counts"]
        .as_str()
        .unwrap_or_else(|| panic!("{sp}"));
    let key = JobScope::new("wordcount", "1")
        .unwrap()
        .store("Partition 0", "counts")
        .unwrap()
        .key(marker)
        .unwrap();
    leg.store
        .delete_many(std::slice::from_ref(&key))
        .await
        .unwrap();
    let out = run(check(&[])).await;
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let c: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = &c["report"]["problems"][0];
    assert_eq!(p["kind"], "not-found", "{c}");
    assert!(p["message"].as_str().unwrap().contains(marker), "{c}");
    let named: Vec<&str> = p["named-by"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(named.iter().any(|b| b.starts_with("savepoint head")), "{c}");
    let out = run(gc).await;
    assert_eq!(
        out.status.code(),
        Some(3),
        "gc fails closed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A zero-copy fork through `blobsnap` commands alone: job wordcount/1 runs and saves a
/// point; job wordcount/2 starts from `savepoint:wordcount/1/NAME`, borrowing every blob (its
/// scope gains no blob of the source's), reprocesses from the savepoint's offsets and ends
/// with counts equal to an independent count. The source cannot remove the savepoint while the
/// fork borrows (exit 6, naming the fork); neither the source's sweep nor the fork's cleanup
/// deletes a borrowed blob; a fork of a fork reads through both.
async fn forks(ms: &MatrixStore, root: &std::path::Path) {
    let leg = ms.leg(root, "forks").await;
    let run = |args: Vec<String>| {
        let mut c = leg.cmd(&args);
        async move { c.output().await.unwrap() }
    };
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    // Retention 1, except the fork's first start: 3 keeps its head — the snapshots that
    // borrow everything — in the history however soon RocksDB compacts the restored files
    // away (a compaction at open is the database's own timing).
    let demo = |dir: &str, lines: &str, extra: &[&str]| {
        let d = root.join(dir).display().to_string();
        let keep = if dir == "fork" && lines == "2000" {
            "3"
        } else {
            "1"
        };
        let mut a = s(&[
            "demo",
            "--dir",
            &d,
            "--partitions",
            "2",
            "--lines",
            lines,
            "--commit-every",
            "300",
            "--retention",
            keep,
        ]);
        a.extend(leg.extra.iter().cloned());
        a.extend(s(extra));
        a
    };
    let json = |out: &std::process::Output| -> serde_json::Value {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let blob_keys = |job: &str, id: &str| {
        let scope = JobScope::new(job, id).unwrap();
        let store = Arc::clone(&leg.store);
        async move {
            list_all(store.as_ref(), scope.scope())
                .await
                .unwrap()
                .into_iter()
                .filter(|m| {
                    matches!(
                        blobsnap::layout::parse(&m.key).map(|p| p.kind),
                        Some(blobsnap::layout::KeyKind::Blob { .. })
                    )
                })
                .map(|m| m.key.as_str().to_string())
                .collect::<BTreeSet<String>>()
        }
    };

    // The source: 2000 lines, a savepoint of its head.
    demo_counts_ok(&run(demo("src", "2000", &[])).await);
    json(
        &run(s(&[
            "savepoint",
            "create",
            "--job",
            "wordcount",
            "--name",
            "base",
        ]))
        .await,
    );
    let source_blobs = blob_keys("wordcount", "1").await;
    assert!(!source_blobs.is_empty());

    // The fork, on the same input: at its first start it has nothing new to process, and
    // its snapshots are the savepoint's files, every blob borrowed — its scope holds none.
    let v = demo_counts_ok(
        &run(demo(
            "fork",
            "2000",
            &[
                "--job-id",
                "2",
                "--start-from",
                "savepoint:wordcount/1/base",
            ],
        ))
        .await,
    );
    for t in v["tasks"].as_array().unwrap() {
        assert!(t["resumed-from"].as_u64() > Some(0), "{v}");
    }
    // Whatever the fork's own database wrote since (RocksDB may flush a recovered WAL at
    // open) has its own content: no blob of the source's is in the fork's scope.
    let shas = |keys: BTreeSet<String>| -> BTreeSet<String> {
        keys.iter()
            .map(|k| k.rsplit('/').next().unwrap().to_string())
            .collect()
    };
    let fork_blobs = shas(blob_keys("wordcount", "2").await);
    assert!(
        fork_blobs.is_disjoint(&shas(source_blobs.clone())),
        "a fork copies no byte: {fork_blobs:?}"
    );
    let forks_of_base = || async {
        json(
            &run(s(&[
                "savepoint",
                "show",
                "--job",
                "wordcount",
                "--name",
                "base",
            ]))
            .await,
        )["forks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["task"].as_str().unwrap().to_string())
            .collect::<BTreeSet<String>>()
    };
    assert_eq!(forks_of_base().await.len(), 2);
    // `checkpoints` shows both sides: the fork's snapshots borrow from the savepoint, the
    // source's saved checkpoint is borrowed by the fork.
    let fork_list = json(&run(s(&["checkpoints", "--job", "wordcount", "--job-id", "2"])).await);
    assert!(
        fork_list["tasks"]["Partition 0"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["stores"]["counts"]["borrows-from"]
                == serde_json::json!(["wordcount/1/base"])),
        "{fork_list}"
    );
    let src_list = json(&run(s(&["checkpoints", "--job", "wordcount"])).await);
    let saved = src_list["tasks"]["Partition 0"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["savepoints"] == serde_json::json!(["base"]))
        .cloned()
        .unwrap_or_else(|| panic!("{src_list}"));
    assert_eq!(
        saved["forks"],
        serde_json::json!(["wordcount/2"]),
        "{src_list}"
    );

    // The source cannot remove what the fork borrows; its sweep keeps it.
    let rm = s(&["savepoint", "rm", "--job", "wordcount", "--name", "base"]);
    let out = run(rm.clone()).await;
    assert_eq!(
        out.status.code(),
        Some(6),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("wordcount/2 task Partition 0"), "{err}");
    demo_counts_ok(&run(demo("src", "3000", &[])).await);
    json(
        &run(s(&[
            "gc",
            "--job",
            "wordcount",
            "--grace-secs",
            "0",
            "--force",
        ]))
        .await,
    );
    let check = |id: &str| s(&["check", "--job", "wordcount", "--job-id", id, "--read-data"]);
    let c = json(&run(check("2")).await);
    assert_eq!(
        c["report"]["problems"].as_array().map(Vec::len),
        Some(0),
        "{c}"
    );
    // The source's usage: what only the pinned savepoint keeps is the forks'; every object
    // in exactly one class, the pins among the metadata.
    let u = json(&run(s(&["usage", "--job", "wordcount", "--grace-secs", "0"])).await);
    let classes = u["usage"]["classes"].as_object().unwrap();
    let objects: u64 = classes
        .iter()
        .filter(|(k, _)| *k != "stale-multipart")
        .map(|(_, c)| c["objects"].as_u64().unwrap())
        .sum();
    assert_eq!(Some(objects), u["usage"]["total-objects"].as_u64(), "{u}");
    assert_eq!(
        classes["savepoints-only"]["objects"].as_u64(),
        Some(0),
        "{u}"
    );
    assert_eq!(
        classes["orphans-past-grace"]["objects"].as_u64(),
        Some(0),
        "{u}"
    );

    // The fork goes on past the savepoint (reprocessing from its offsets, counts checked);
    // its cleanup and sweep never delete a borrowed blob, and a task whose retained
    // snapshots still borrow keeps its pin (once none does, the pin is released).
    let v = demo_counts_ok(&run(demo("fork", "4000", &["--job-id", "2"])).await);
    for t in v["tasks"].as_array().unwrap() {
        assert!(t["processed"].as_u64() > Some(0), "{v}");
    }
    json(
        &run(s(&[
            "gc",
            "--job",
            "wordcount",
            "--job-id",
            "2",
            "--grace-secs",
            "0",
            "--force",
        ]))
        .await,
    );
    for id in ["1", "2"] {
        let c = json(&run(check(id)).await);
        assert_eq!(
            c["report"]["problems"].as_array().map(Vec::len),
            Some(0),
            "{c}"
        );
    }
    let fork_job = JobScope::new("wordcount", "2").unwrap();
    let cps = blobsnap::checkpoint::BlobCheckpointStore::new(Arc::clone(&leg.store), fork_job);
    let mut borrowing = BTreeSet::new();
    for task in ["Partition 0", "Partition 1"] {
        for c in cps.history(task, usize::MAX).await.unwrap() {
            let v2 = c.checkpoint.as_v2().unwrap();
            let marker = v2
                .marker(blobsnap::blob::FACTORY_NAME, "counts")
                .unwrap()
                .to_string();
            let who = blobsnap::blob::Expected {
                job_name: "wordcount",
                job_id: "2",
                task_name: task,
                store_name: "counts",
            };
            let snap = blobsnap::blob::load_snapshot(leg.store.as_ref(), &who, &marker)
                .await
                .unwrap();
            if !snap.index.borrowed_from.is_empty() {
                borrowing.insert(task.to_string());
            }
        }
    }
    let pinned = forks_of_base().await;
    assert!(
        pinned.is_superset(&borrowing),
        "every task that borrows holds its pin: {pinned:?} {borrowing:?}"
    );
    let out = run(rm.clone()).await;
    assert_eq!(
        out.status.code(),
        Some(if pinned.is_empty() { 0 } else { 6 }),
        "rm refuses exactly while a pin is held ({pinned:?}): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A fork that applied its start-from restarts with the same setting, even once its
    // source removed the savepoint.
    demo_counts_ok(
        &run(demo(
            "fork",
            "4000",
            &[
                "--job-id",
                "2",
                "--start-from",
                "savepoint:wordcount/1/base",
            ],
        ))
        .await,
    );

    // A fork of the fork reads through both scopes, and holds its own pins.
    json(
        &run(s(&[
            "savepoint",
            "create",
            "--job",
            "wordcount",
            "--job-id",
            "2",
            "--name",
            "f1",
        ]))
        .await,
    );
    let v = demo_counts_ok(
        &run(demo(
            "fork2",
            "5000",
            &["--job-id", "3", "--start-from", "savepoint:wordcount/2/f1"],
        ))
        .await,
    );
    assert!(v["tasks"][0]["processed"].as_u64() > Some(0), "{v}");
    let restored = root.join("r3");
    let out = run(s(&[
        "restore",
        "--job",
        "wordcount",
        "--job-id",
        "3",
        "--task",
        "Partition 1",
        "--store",
        "counts",
        "--to",
        &restored.display().to_string(),
    ]))
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let state =
        blobsnap::job::store_dir(&root.join("fork2").join("state"), "counts", "Partition 1")
            .unwrap();
    let keys = |p: &std::path::Path| {
        let db = RocksStore::open("counts", p).unwrap();
        db.db()
            .iterator(rocksdb::IteratorMode::Start)
            .map(|kv| kv.unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(keys(&state), keys(&restored), "the fork's state, restored");
    // The chain's pins: job 3 pins savepoint f1 of job 2; whatever it still borrows from job
    // 1 it pins there too.
    let sp = json(
        &run(s(&[
            "savepoint",
            "show",
            "--job",
            "wordcount",
            "--job-id",
            "2",
            "--name",
            "f1",
        ]))
        .await,
    );
    assert!(
        sp["forks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["fork-job"] == "wordcount" && f["fork-id"] == "3"),
        "{sp}"
    );

    // A fork point that is not there: refused before anything starts.
    let out = run(demo(
        "fork4",
        "5000",
        &[
            "--job-id",
            "4",
            "--start-from",
            "savepoint:wordcount/1/nope",
        ],
    ))
    .await;
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A crash-injected soak (issue 32 §6): the demo job is SIGKILLed at crash points — mid
/// upload, before and after its checkpoint write, in its cleanup, mid restore (on a new
/// host: its local state deleted first), at its end — run after run on one store, each run
/// with more input; then it runs to its end (counts checked). The kills must have left
/// something to sweep, and **one** sweep (`gc --grace-secs 0 --force`) leaves exactly what
/// the retained checkpoints reference, read by the test itself (`support::referenced`, not
/// the classifier under test); `usage` then agrees: no orphan, no unknown key, no byte past
/// the grace. Every point of the short list (CI) must kill its run; `BLOBSNAP_SOAK_ROUNDS`
/// adds rounds over every crash point (the long-test command: 5), where a point the demo
/// does not reach in that configuration (lazy, pre-upload) runs to its end.
async fn crash_soak(ms: &MatrixStore, root: &std::path::Path) {
    use std::os::unix::process::ExitStatusExt as _;
    let leg = ms.leg(root, "soak").await;
    let d = root.join("demo").display().to_string();
    let rounds: u32 = std::env::var("BLOBSNAP_SOAK_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut crashes: Vec<String> = [
        "backup.mid-upload@2",
        "commit.before-checkpoint@3",
        "commit.after-checkpoint@2",
        "commit.during-cleanup@2",
        "restore.mid-download@1",
        "task.end-of-input@1",
    ]
    .map(String::from)
    .to_vec();
    let short = crashes.len();
    for r in 0..rounds {
        for p in job_points().iter().filter(|p| !p.starts_with("sweep.")) {
            crashes.push(format!("{p}@{}", 1 + r % 3));
        }
    }
    let demo = |lines: u64| {
        let mut a: Vec<String> = [
            "demo",
            "--dir",
            &d,
            "--partitions",
            "2",
            "--lines",
            &lines.to_string(),
            "--commit-every",
            "200",
        ]
        .map(String::from)
        .to_vec();
        a.extend(leg.extra.iter().cloned());
        a
    };
    let mut lines = 1_000u64;
    let mut killed = 0;
    for (i, at) in crashes.iter().enumerate() {
        lines += 500;
        if at.starts_with("restore.") {
            // A new host: the restore has everything to download.
            let _ = std::fs::remove_dir_all(root.join("demo").join("state"));
        }
        let out = leg
            .cmd(&demo(lines))
            .env("BLOBSNAP_CRASH_AT", at)
            .output()
            .await
            .unwrap();
        if out.status.success() {
            assert!(
                i >= short,
                "{at}: the run was not killed (every point of the short list must be reached)"
            );
            continue;
        }
        assert_eq!(
            out.status.signal(),
            Some(9),
            "{at}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        killed += 1;
    }
    assert!(
        killed >= crashes.len() / 2,
        "{killed} of {} runs were killed",
        crashes.len()
    );
    demo_counts_ok(&leg.cmd(&demo(lines)).output().await.unwrap());
    let json = |out: std::process::Output| -> serde_json::Value {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let before = json(
        leg.cmd(&["usage", "--job", "wordcount", "--grace-secs", "0"].map(String::from))
            .output()
            .await
            .unwrap(),
    );
    let swept =
        sweep_leaves_exactly_the_referenced(leg.cmd(&[]), &leg.store, 2, "crash soak").await;
    let after = json(
        leg.cmd(&["usage", "--job", "wordcount", "--grace-secs", "0"].map(String::from))
            .output()
            .await
            .unwrap(),
    );
    let class = |v: &serde_json::Value, c: &str| {
        let c = &v["usage"]["classes"][c];
        (c["objects"].as_u64().unwrap(), c["bytes"].as_u64().unwrap())
    };
    eprintln!(
        "crash soak: {killed} of {} runs killed; before the sweep {:?} past the grace, {:?} within; {swept} objects swept; after {:?}",
        crashes.len(),
        class(&before, "orphans-past-grace"),
        class(&before, "orphans-within-grace"),
        class(&after, "orphans-past-grace")
    );
    assert!(swept > 0, "the kills left nothing to sweep: {before}");
    for c in [
        "orphans-past-grace",
        "orphans-within-grace",
        "unknown",
        "stale-multipart",
    ] {
        assert_eq!(class(&after, c), (0, 0), "{c} after one sweep: {after}");
    }
    assert!(class(&after, "live").0 > 0, "{after}");
    // The job still restores and resumes where it was.
    let v = demo_counts_ok(&leg.cmd(&demo(lines)).output().await.unwrap());
    assert_eq!(v["tasks"][0]["processed"].as_u64(), Some(0), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_soak_leaves_nothing_past_the_grace_after_one_sweep() {
    let tmp = tempfile::tempdir().unwrap();
    crash_soak(&MatrixStore::Local, tmp.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forks_local() {
    let tmp = tempfile::tempdir().unwrap();
    forks(&MatrixStore::Local, tmp.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_through_time_local() {
    let tmp = tempfile::tempdir().unwrap();
    state_through_time(&MatrixStore::Local, tmp.path()).await;
}
