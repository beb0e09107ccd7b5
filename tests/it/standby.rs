//! The warm standby (issue 18 §2), with real RocksDB on the local store: it follows a task's
//! commits without writing a byte to the blob store, downloads only what each commit adds,
//! never swaps in a snapshot it could not verify, survives a snapshot going away under it,
//! catches up from the newest checkpoint, and a failover to its host downloads nothing it
//! already holds. Waits are for the standby's own events, never for time.

use crate::support;

use std::sync::Arc;

use blobsnap::backend::{StateBackendFactory, SystemClock};
use blobsnap::blob::factory::BlobStateBackendFactory;
use blobsnap::blob::restore::{RestoreSettings, RestoredMarker, RESTORED_MARKER};
use blobsnap::blobstore::counting::CountingStore;
use blobsnap::blobstore::local::LocalStore;
use blobsnap::blobstore::BlobStore;
use blobsnap::checkpoint::{BlobCheckpointStore, CheckpointStore as _, Ssp};
use blobsnap::job::standby::{follow, standby_specs, StandbySettings, StandbyUpdate};
use blobsnap::job::{wordcount, JobSettings};
use blobsnap::layout::JobScope;
use tokio::sync::mpsc;

const TASK: &str = "Partition 0";
/// The job of the local-store cases.
const JOB: &str = "wordcount";

fn settings(state: &std::path::Path, input: &std::path::Path, job: &str) -> JobSettings {
    JobSettings {
        job_name: job.into(),
        job_id: "1".into(),
        state_dir: state.to_path_buf(),
        input_dir: input.to_path_buf(),
        stream: "lines".into(),
        partitions: 1,
        stores: vec!["counts".into()],
        commit_every: 400,
        commit_interval: std::time::Duration::ZERO,
        retention: 2,
        unsafe_no_fencing: false,
        commit_max_delay: std::time::Duration::from_secs(60),
        sweep_every_commits: 0,
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
    }
}

async fn run_job(
    settings: &JobSettings,
    store: Arc<dyn BlobStore>,
) -> Vec<blobsnap::job::TaskSummary> {
    let admin = blobsnap::blob::admin::BlobStoreAdmin::new(
        Arc::clone(&store),
        None,
        &settings.job_name,
        &settings.job_id,
        &settings.deployment_id,
    )
    .unwrap()
    .with_gc_grace(settings.gc_grace);
    let observer: Arc<blobsnap::job::CommitObserver> = Arc::new(|_, _, _| {});
    wordcount::run(settings, store, &admin, Arc::new(SystemClock), observer)
        .await
        .unwrap()
}

fn backend(store: &Arc<dyn BlobStore>) -> Arc<dyn StateBackendFactory> {
    Arc::new(BlobStateBackendFactory::new(
        Arc::clone(store),
        None,
        Default::default(),
        RestoreSettings::default(),
        "test",
    ))
}

/// A running standby: its events, and the means to stop it.
struct Standby {
    events: mpsc::UnboundedReceiver<StandbyUpdate>,
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<blobsnap::Result<()>>,
}

fn start(settings: &JobSettings, store: Arc<dyn BlobStore>) -> Standby {
    let (tx, events) = mpsc::unbounded_channel();
    let stop = tokio_util::sync::CancellationToken::new();
    let (settings, token) = (settings.clone(), stop.clone());
    let task = tokio::spawn(async move {
        let backend = backend(&store);
        let on_update = move |u: &StandbyUpdate| {
            let _ = tx.send(u.clone());
        };
        follow(
            &settings,
            TASK,
            store,
            &backend,
            Arc::new(SystemClock),
            &StandbySettings {
                poll: std::time::Duration::from_millis(20),
            },
            token,
            &on_update,
        )
        .await
    });
    Standby { events, stop, task }
}

impl Standby {
    /// The next event that is not a quiet poll.
    async fn next_change(&mut self) -> StandbyUpdate {
        loop {
            match self.events.recv().await.expect("the standby stopped") {
                StandbyUpdate::Unchanged { .. } => continue,
                other => return other,
            }
        }
    }

    /// Wait until checkpoint `target` is applied (a standby that polls while the task commits
    /// may apply some of the commits before it, never a skip), and return that update's
    /// download and reuse.
    async fn applied(&mut self, target: u64) -> (u64, u64) {
        let mut last = 0;
        loop {
            match self.next_change().await {
                StandbyUpdate::Applied {
                    seq,
                    bytes_downloaded,
                    bytes_reused,
                    ..
                } => {
                    assert!(
                        seq > last && seq <= target,
                        "{last} → {seq} (target {target})"
                    );
                    if seq == target {
                        return (bytes_downloaded, bytes_reused);
                    }
                    last = seq;
                }
                other => panic!("expected checkpoint {target} to be applied: {other:?}"),
            }
        }
    }

    /// Wait for `n` quiet polls.
    async fn quiet_polls(&mut self, n: usize) {
        let mut seen = 0;
        while seen < n {
            match self.events.recv().await.expect("the standby stopped") {
                StandbyUpdate::Unchanged { .. } => seen += 1,
                other => panic!("expected a quiet poll, got {other:?}"),
            }
        }
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
    }
}

async fn latest_seq(store: &Arc<dyn BlobStore>, job: &str) -> (u64, String) {
    let cps = BlobCheckpointStore::new(Arc::clone(store), JobScope::new(job, "1").unwrap());
    let c = cps.latest(TASK).await.unwrap().unwrap();
    (c.seq, c.checkpoint.as_v2().unwrap().id.to_string())
}

fn standby_marker(settings: &JobSettings) -> RestoredMarker {
    let dir = &standby_specs(settings, TASK).unwrap()[0].dir;
    serde_json::from_slice(&std::fs::read(dir.join(RESTORED_MARKER)).unwrap()).unwrap()
}

/// The standby follows commit by commit, writing nothing and downloading only each commit's
/// new files; a quiet poll costs one LIST; a failover to its host (the task's host gone)
/// resumes at the committed offset with every count right and downloads no blob at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_follows_without_writing_and_a_failover_downloads_nothing_it_holds() {
    let tmp = tempfile::tempdir().unwrap();
    let store: Arc<dyn BlobStore> = Arc::new(LocalStore::new(tmp.path().join("store")).unwrap());
    follows_and_fails_over(store, JOB, false).await;
}

mod external {
    use super::*;

    /// The same on the S3 server of the external suites (LocalStack, Garage).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs BLOBSNAP_TEST_S3_ENDPOINT; run by scripts/test.sh"]
    async fn a_standby_follows_without_writing_and_a_failover_downloads_nothing_it_holds() {
        let h = support::external().await;
        let fences = h
            .store
            .capabilities(blobsnap::blobstore::Probe::IfUnknown)
            .await
            .unwrap()
            .create_only
            == blobsnap::blobstore::CreateOnly::Atomic;
        let job = h.scope.as_str().trim_end_matches('/').to_string();
        follows_and_fails_over(Arc::clone(&h.store), &job, !fences).await;
        h.cleanup().await;
    }
}

async fn follows_and_fails_over(store: Arc<dyn BlobStore>, job: &str, no_fence: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("input");
    let mut host_a = settings(&tmp.path().join("a/state"), &input, job);
    host_a.unsafe_no_fencing = no_fence;
    let mut host_b = settings(&tmp.path().join("b/state"), &input, job);
    host_b.unsafe_no_fencing = no_fence;
    wordcount::generate_input(&input, 1, 3000, 11).unwrap();
    run_job(&host_a, Arc::clone(&store)).await;
    let (seq1, id1) = latest_seq(&store, job).await;

    let counting = CountingStore::new(Arc::clone(&store));
    let counters = counting.counters();
    let mut standby = start(&host_b, Arc::new(counting));
    let StandbyUpdate::Applied {
        seq,
        bytes_downloaded: first_download,
        ..
    } = standby.next_change().await
    else {
        panic!("the first update applies the newest checkpoint");
    };
    assert_eq!(seq, seq1);
    assert!(first_download > 0);
    assert_eq!(
        standby_marker(&host_b).checkpoint_id.unwrap().to_string(),
        id1
    );
    // Quiet polls: one LIST each, nothing read.
    standby.quiet_polls(1).await;
    let before = counters.snapshot();
    standby.quiet_polls(3).await;
    let quiet = counters.snapshot();
    assert_eq!(quiet.list.calls - before.list.calls, 3, "one LIST a poll");
    assert_eq!(quiet.get.calls, before.get.calls);
    assert_eq!(quiet.head.calls, before.head.calls);

    // The task goes on on host A: the standby applies the newest commit, downloading only
    // what it adds.
    wordcount::generate_input(&input, 1, 4000, 11).unwrap();
    run_job(&host_a, Arc::clone(&store)).await;
    let (seq2, id2) = latest_seq(&store, job).await;
    assert!(seq2 > seq1);
    let (bytes_downloaded, bytes_reused) = standby.applied(seq2).await;
    assert!(bytes_reused > 0, "it reuses what it holds");
    assert!(
        bytes_downloaded < first_download,
        "a commit's delta ({bytes_downloaded}) is less than the whole store ({first_download})"
    );
    assert_eq!(
        standby_marker(&host_b).checkpoint_id.unwrap().to_string(),
        id2
    );

    // Host A is gone. The task starts on host B while the standby runs: its restore links
    // from the standby's copy and fetches no blob.
    let blob_gets = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let seen = Arc::clone(&blob_gets);
    let hooked: Arc<dyn BlobStore> = Arc::new(support::Hooked::new(
        Arc::clone(&store),
        Box::new(move |key, _| {
            if key.as_str().contains("/blobs/") {
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            None
        }),
    ));
    let cps = BlobCheckpointStore::new(Arc::clone(&store), JobScope::new(job, "1").unwrap());
    let committed = cps.latest(TASK).await.unwrap().unwrap();
    let offset: u64 = committed.checkpoint.as_v2().unwrap().input_offsets
        [&Ssp::new("files", "lines", 0)]
        .parse()
        .unwrap();
    wordcount::generate_input(&input, 1, 4500, 11).unwrap();
    let summaries = run_job(&host_b, hooked).await;
    assert_eq!(
        summaries[0].resumed_from, offset,
        "resumed at the committed offset"
    );
    assert_eq!(
        blob_gets.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the failover found every file in the standby's copy"
    );
    assert_eq!(
        wordcount::count_stores(&host_b.state_dir, 1).unwrap(),
        wordcount::count_input(&input, 1).unwrap()
    );
    standby.stop().await;
    // The standby never wrote, deleted or aborted anything.
    let all = counters.snapshot();
    assert_eq!(all.put.requests, 0, "{all:?}");
    assert_eq!(all.delete.requests, 0, "{all:?}");
    assert_eq!(all.multipart.requests, 0, "{all:?}");
}

/// A standby never swaps in a snapshot it could not verify (a corrupt blob on the server:
/// its dir keeps the last verified one), is not stopped by it, does not fetch it again at
/// every poll, and when it fell behind several commits goes straight to the newest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_skips_what_it_cannot_verify_and_catches_up_from_the_newest() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("input");
    let host_a = settings(&tmp.path().join("a/state"), &input, JOB);
    let host_b = settings(&tmp.path().join("b/state"), &input, JOB);
    let store_dir = tmp.path().join("store");
    let store: Arc<dyn BlobStore> = Arc::new(LocalStore::new(&store_dir).unwrap());
    wordcount::generate_input(&input, 1, 2000, 5).unwrap();
    run_job(&host_a, Arc::clone(&store)).await;
    let (seq1, id1) = latest_seq(&store, JOB).await;
    let mut standby = start(&host_b, Arc::clone(&store));
    assert!(
        matches!(standby.next_change().await, StandbyUpdate::Applied { seq, .. } if seq == seq1)
    );
    standby.stop().await;

    // Three more runs while the standby is down: it fell behind several commits.
    for lines in [2600, 3200, 3800] {
        wordcount::generate_input(&input, 1, lines, 5).unwrap();
        run_job(&host_a, Arc::clone(&store)).await;
    }
    let (seq2, id2) = latest_seq(&store, JOB).await;
    assert!(seq2 >= seq1 + 3, "{seq1} → {seq2}");
    // Corrupt a blob only the newest snapshot has (same size): one of its new SSTs (not, say,
    // the OPTIONS file it now shares as a blob, whose bytes the standby already holds and
    // reuses without a download).
    let index = walk(&store_dir)
        .into_iter()
        .find(|p| p.to_string_lossy().contains(&format!("/index/{id2}.")))
        .expect("the newest index");
    let index =
        blobsnap::index::SnapshotIndex::from_slice(&std::fs::read(&index).unwrap()).unwrap();
    // (Uploaded by its commit, or pre-uploaded for it: new either way.)
    let new_ssts: Vec<String> = index
        .present_files()
        .into_iter()
        .filter(|(p, _)| p.ends_with(".sst"))
        .filter_map(|(_, f)| f.blobs.first())
        .filter(|b| index.blob_origin(b) != blobsnap::index::BlobOrigin::Reused)
        .map(|b| b.blob_id.clone())
        .collect();
    let new_blobs: Vec<std::path::PathBuf> = walk(&store_dir)
        .into_iter()
        .filter(|p| {
            let p = p.to_string_lossy();
            new_ssts.iter().any(|b| p.ends_with(&format!("/{b}")))
        })
        .collect();
    let victim = new_blobs
        .iter()
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .expect("the newest commit uploaded a blob")
        .clone();
    let good = std::fs::read(&victim).unwrap();
    let mut bad = good.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0xff;
    std::fs::write(&victim, &bad).unwrap();

    let mut standby = start(&host_b, Arc::clone(&store));
    match standby.next_change().await {
        StandbyUpdate::Skipped { seq, kind, message } => {
            assert_eq!(seq, seq2, "the newest, not the next one");
            assert_eq!(kind, blobsnap::ErrorKind::Corrupt, "{message}");
        }
        other => panic!("expected the corrupt snapshot to be skipped: {other:?}"),
    }
    assert_eq!(
        standby_marker(&host_b).checkpoint_id.unwrap().to_string(),
        id1,
        "the standby dir still holds the last verified snapshot"
    );
    // Not fetched again at every poll.
    standby.quiet_polls(3).await;

    // The server is mended and the task commits again: the standby goes to the newest.
    std::fs::write(&victim, &good).unwrap();
    wordcount::generate_input(&input, 1, 4400, 5).unwrap();
    run_job(&host_a, Arc::clone(&store)).await;
    let (seq3, id3) = latest_seq(&store, JOB).await;
    standby.applied(seq3).await;
    assert_eq!(
        standby_marker(&host_b).checkpoint_id.unwrap().to_string(),
        id3
    );
    standby.stop().await;
}

/// A snapshot deleted under the standby while it fetches (cleanup, the sweep) is skipped; the
/// next commit is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_deleted_under_the_standby_is_skipped() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("input");
    let host_a = settings(&tmp.path().join("a/state"), &input, JOB);
    let host_b = settings(&tmp.path().join("b/state"), &input, JOB);
    let store: Arc<dyn BlobStore> = Arc::new(LocalStore::new(tmp.path().join("store")).unwrap());
    wordcount::generate_input(&input, 1, 2000, 9).unwrap();
    run_job(&host_a, Arc::clone(&store)).await;
    let (seq1, _) = latest_seq(&store, JOB).await;
    // The first blob GET finds its object deleted, as a cleanup racing the standby leaves it.
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let fire = Arc::clone(&armed);
    let hooked: Arc<dyn BlobStore> = Arc::new(support::Hooked::new(
        Arc::clone(&store),
        Box::new(move |key, _| {
            (key.as_str().contains("/blobs/")
                && fire.swap(false, std::sync::atomic::Ordering::SeqCst))
            .then(|| blobsnap::Error::new(blobsnap::ErrorKind::NotFound, format!("{key}: deleted")))
        }),
    ));
    let mut standby = start(&host_b, hooked);
    match standby.next_change().await {
        StandbyUpdate::Skipped { seq, kind, message } => {
            assert_eq!(seq, seq1);
            assert_eq!(kind, blobsnap::ErrorKind::NotFound, "{message}");
        }
        other => panic!("expected a skip: {other:?}"),
    }
    let standby_dir = &standby_specs(&host_b, TASK).unwrap()[0].dir;
    assert!(
        !standby_dir.join(RESTORED_MARKER).exists(),
        "nothing half-fetched was swapped in"
    );
    wordcount::generate_input(&input, 1, 2600, 9).unwrap();
    run_job(&host_a, Arc::clone(&store)).await;
    let (seq2, _) = latest_seq(&store, JOB).await;
    standby.applied(seq2).await;
    standby.stop().await;
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
