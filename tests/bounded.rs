//! Bounded resources: a backup and a restore of a store of many small files, and of one large
//! file, keep the process's peak memory (VmHWM) and its open file descriptors bounded,
//! whatever the size. Real files, the real backup and restore managers, the local store and
//! the in-process S3 server.
//!
//! Sizes: `BLOBSNAP_BOUNDED_FILES` (default 5,000; the long-test command: 100,000) and
//! `BLOBSNAP_BOUNDED_BIG_MIB` (default 256; the long-test command: 8192, needs ~3× that free);
//! 0 skips that case.
//! The peak is process-wide, so both cases run in one test, one after the other; each asserts
//! on how much the peak grew during its own backup and restore.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Open descriptors at once during a backup and a restore: the bound docs/reliability.md's "Reliability,
/// tested" states (the transfer budgets of 8 uploads and 8 downloads, RocksDB's and the
/// runtime's own, with room): independent of the file count and the file size.
const FD_BOUND: u64 = 128;

use blobsnap::backend::{
    StoreMarkers, StoreSpec, SystemClock, TaskBackupManager as _, TaskContext,
    TaskRestoreManager as _,
};
use blobsnap::blob::backup::{BackupSettings, BlobBackupManager};
use blobsnap::blob::restore::{BlobRestoreManager, RestoreSettings};
use blobsnap::blob::FACTORY_NAME;
use blobsnap::checkpoint::{Checkpoint, CheckpointIdGen, CheckpointV2};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Peak resident set (VmHWM) and the current one, in KiB.
fn rss_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// Samples the open descriptors every 5 ms while alive; returns the maximum seen.
struct FdWatch {
    stop: Arc<AtomicBool>,
    max: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FdWatch {
    fn start() -> FdWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let max = Arc::new(AtomicU64::new(0));
        let (s, m) = (Arc::clone(&stop), Arc::clone(&max));
        let thread = std::thread::spawn(move || {
            while !s.load(Relaxed) {
                let n = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count()) as u64;
                m.fetch_max(n, Relaxed);
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        });
        FdWatch {
            stop,
            max,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.max.load(Relaxed)
    }
}

/// Back `src` up and restore it into a fresh dir through `h`; check the restore is exact;
/// return (peak RSS growth KiB, max fds).
async fn round_trip(h: &support::Harness, src: &std::path::Path) -> (u64, u64) {
    let task = TaskContext {
        job_name: h.scope.as_str().trim_end_matches('/').to_string(),
        job_id: "1".into(),
        task_name: "Partition 0".into(),
    };
    let tmp = tempfile::tempdir_in(src.parent().unwrap()).unwrap();
    let spec = StoreSpec {
        name: "counts".into(),
        dir: tmp.path().join("live"),
    };
    let before = rss_kib().0;
    let fds = FdWatch::start();
    let mgr = BlobBackupManager::new(
        Arc::clone(&h.store),
        task.clone(),
        std::slice::from_ref(&spec),
        Arc::new(SystemClock),
        BackupSettings {
            hash_cache: false,
            ..Default::default()
        },
    )
    .unwrap();
    mgr.init(None).await.unwrap();
    let id = CheckpointIdGen::new().next(1_800_000_000_000).unwrap();
    let markers = mgr
        .upload(
            id,
            &StoreMarkers::new(),
            &BTreeMap::from([("counts".to_string(), src.to_path_buf())]),
        )
        .await
        .unwrap();
    let cp = Checkpoint::V2(CheckpointV2 {
        id,
        input_offsets: Default::default(),
        state_checkpoint_markers: BTreeMap::from([(FACTORY_NAME.to_string(), markers)]),
    });
    let dst = StoreSpec {
        name: "counts".into(),
        dir: tmp.path().join("restored"),
    };
    let r = BlobRestoreManager::new(
        Arc::clone(&h.store),
        task,
        std::slice::from_ref(&dst),
        RestoreSettings::default(),
    )
    .unwrap();
    r.init(Some(&cp)).await.unwrap();
    r.restore().await.unwrap();
    let max_fds = fds.finish();
    let grown = rss_kib().0.saturating_sub(before);
    // Exact: same names and sizes (contents were verified by SHA-256 on the way).
    let list = |d: &std::path::Path| -> BTreeMap<String, u64> {
        std::fs::read_dir(d)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name() != blobsnap::blob::restore::RESTORED_MARKER)
            .map(|e| {
                (
                    e.file_name().to_string_lossy().into_owned(),
                    e.metadata().unwrap().len(),
                )
            })
            .collect()
    };
    assert_eq!(
        list(src),
        list(&dst.dir),
        "{}: the restore is exact",
        h.name
    );
    (grown, max_fds)
}

async fn many_small_files() {
    let n = env_u64("BLOBSNAP_BOUNDED_FILES", 5_000);
    let work = tempfile::tempdir_in("/var/tmp").unwrap();
    let src = work.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    for i in 0..n {
        std::fs::write(src.join(format!("{i:07}.sst")), format!("small file {i}\n")).unwrap();
    }
    for h in [support::local().await, support::s3s().await] {
        let (grown, fds) = round_trip(&h, &src).await;
        eprintln!(
            "{n} small files through {}: peak RSS grew {} MiB, at most {fds} open descriptors",
            h.name,
            grown / 1024
        );
        // Memory may grow with the count of files, linearly (DESIGN §11: the indexes in hand
        // are O(files)); descriptors must not. Measured at 100,000 files: ~2.7 KiB per file
        // at the peak of a backup and a restore in one process (the scan tree, the index and
        // its JSON, the backup's committed index and the restore's own index and plan, all
        // at once); bounded here at 3 KiB per file.
        assert!(
            grown < 64 * 1024 + 3 * n,
            "{}: peak RSS grew {grown} KiB for {n} files",
            h.name
        );
        // The documented bound (docs/reliability.md): fewer than FD_BOUND at once, whatever the file
        // count (measured: 31 local, 48 through s3s-fs at 100,000 files).
        assert!(fds < FD_BOUND, "{}: {fds} descriptors open at once", h.name);
        // No per-key cleanup: both stores live in the harness's temp dir, gone with it (s3s-fs
        // lists in O(objects) per page: deleting 100,000 keys one page at a time took longer
        // than the round trip).
    }
}

async fn one_large_file() {
    let mib = env_u64("BLOBSNAP_BOUNDED_BIG_MIB", 256);
    let work = tempfile::tempdir_in("/var/tmp").unwrap();
    let src = work.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    {
        use rand::{RngCore as _, SeedableRng as _};
        use std::io::Write as _;
        let mut rng = rand::rngs::StdRng::seed_from_u64(8);
        let mut f = std::io::BufWriter::new(std::fs::File::create(src.join("000001.sst")).unwrap());
        let mut buf = vec![0u8; 1 << 20];
        for _ in 0..mib {
            rng.fill_bytes(&mut buf);
            f.write_all(&buf).unwrap();
        }
        f.flush().unwrap();
    }
    ambiguous_put_settles_in_bounded_memory(&src.join("000001.sst"), mib).await;
    // s3s-fs: single PUTs (its multipart fails for long keys), so only up to S3's 5 GiB
    // single-PUT limit; the multipart path of a larger file is measured on Garage by
    // `benches/compare.sh --scaling` (an 8 GiB store).
    let mut stores = vec![support::local().await];
    if mib << 20 <= blobsnap::blobstore::s3::MAX_SINGLE_PUT {
        stores.push(
            support::s3s_with(|c| c.multipart_threshold = blobsnap::blobstore::s3::MAX_SINGLE_PUT)
                .await,
        );
    } else {
        eprintln!("one {mib} MiB file: not through s3s-fs (over the 5 GiB single-PUT limit; its multipart fails for long keys)");
    }
    for h in stores {
        let (grown, fds) = round_trip(&h, &src).await;
        eprintln!(
            "one {mib} MiB file through {}: peak RSS grew {} MiB, at most {fds} open descriptors",
            h.name,
            grown / 1024
        );
        assert!(
            grown < 256 * 1024,
            "{}: peak RSS grew {grown} KiB for a {mib} MiB file",
            h.name
        );
        assert!(fds < FD_BOUND, "{}: {fds} descriptors", h.name);
        h.cleanup().await;
    }
}

/// A create-only PUT of the large file whose response is lost (the object was stored, the
/// call failed): the retry layer's next attempt gets 412 and settles by reading the object
/// back — streamed and hashed, so the peak grows by chunks, not by the object (it used to
/// read the whole object into memory: a 256 MiB file grew the peak by ≥ 256 MiB). Runs first,
/// while the process-wide peak is still near the resident set.
async fn ambiguous_put_settles_in_bounded_memory(file: &std::path::Path, mib: u64) {
    use blobsnap::blobstore::fault::{FaultConfig, FaultStore};
    use blobsnap::blobstore::retry::{RetryPolicy, RetryStore};
    use blobsnap::blobstore::{BlobKey, BlobStore as _, PutBody, PutOptions};
    let h = support::local().await;
    let faulty = FaultStore::new(
        Arc::clone(&h.store),
        FaultConfig {
            ambiguous_rate: 1.0,
            seed: 1,
            ..Default::default()
        },
    );
    let store = RetryStore::new(
        faulty,
        RetryPolicy {
            initial_delay_ms: 1,
            max_delay_ms: 10,
            ..Default::default()
        },
    );
    let digest = blobsnap::digest::hash_file(file).unwrap();
    let key = BlobKey::new(format!("{}bounded/ambiguous.sst", h.scope.as_str())).unwrap();
    let before = rss_kib().0;
    let r = store
        .put(
            &key,
            PutBody::File {
                path: file.to_path_buf(),
                len: digest.size,
            },
            PutOptions::create_only(digest.sha256),
        )
        .await
        .expect("a lost response is settled by reading back");
    let grown = rss_kib().0.saturating_sub(before);
    assert_eq!(r.requests, 2, "the lost attempt and the one that got 412");
    assert!(store.inner().injected() >= 1, "the response was lost");
    eprintln!(
        "lost PUT response of a {mib} MiB blob settled by read-back: peak RSS grew {} MiB",
        grown / 1024
    );
    assert!(
        grown < 64 * 1024,
        "settling a lost PUT response of a {mib} MiB blob grew the peak by {grown} KiB"
    );
}

/// One test (the peak RSS is process-wide): many small files, then one large file. Long
/// (~5 min in a debug build at the default sizes): run by `scripts/long-test.sh`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes long: scripts/test.sh runs it at the default sizes, scripts/long-test.sh at 100,000 files and 8 GiB"]
async fn memory_and_descriptors_stay_bounded() {
    // 0 skips a case (to repeat the other alone).
    if env_u64("BLOBSNAP_BOUNDED_FILES", 5_000) > 0 {
        many_small_files().await;
    }
    if env_u64("BLOBSNAP_BOUNDED_BIG_MIB", 256) > 0 {
        one_large_file().await;
    }
}
