//! End-to-end backup and restore benchmark (not a test: it prints numbers).
//!
//! ```sh
//! cargo bench --bench backup -- [--size-mib 1024] [--stores local,s3s,external]
//! ```
//!
//! Generates a RocksDB store of the given size (random, incompressible 16 KiB values), then
//! for each store measures: the sync snapshot step (flush + RocksDB checkpoint, with an empty
//! memtable), a full upload (MB/s, requests), and, after writing 5 % new data, the snapshot
//! step (now with a memtable flush) and the incremental upload (bytes and requests sent);
//! then restores the latest snapshot into an empty directory, and into one that holds 90 % of
//! the files (MB/s, bytes downloaded, GET requests).
//!
//! Stores: `local` (a directory on the same disk), `s3s` (the in-process s3s-fs server of the
//! test harness, on loopback), `external` (the server named by `BLOBSNAP_TEST_S3_ENDPOINT`,
//! e.g. LocalStack started by `minio/localstack.sh start`).

#[path = "../tests/support/mod.rs"]
mod support;

mod common;
use common::{arg, dir_size, fill, mbps, median};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use blobsnap::backend::TaskRestoreManager as _;
use blobsnap::backend::{
    Clock, StoreEngine, StoreMarkers, StoreSpec, SystemClock, TaskBackupManager, TaskContext,
};
use blobsnap::blob::backup::{BackupSettings, BlobBackupManager};
use blobsnap::blob::restore::{BlobRestoreManager, RestoreSettings};
use blobsnap::blobstore::counting::CountingStore;
use blobsnap::blobstore::BlobStore;
use blobsnap::checkpoint::CheckpointIdGen;
use blobsnap::local::rocks::RocksStore;

async fn run(name: &str, h: support::Harness, size_mib: u64) {
    let tmp =
        tempfile::tempdir_in(std::env::var("BENCH_TMP").unwrap_or_else(|_| "/var/tmp".into()))
            .expect("tempdir");
    let dir = tmp.path().join("store");
    let db = RocksStore::open("bench", &dir).expect("open");
    let t = Instant::now();
    let keys = fill(&db, 0, size_mib << 20, 1);
    db.flush().expect("flush");
    db.db().compact_range::<&[u8], &[u8]>(None, None);
    let spec = StoreSpec {
        name: "bench".into(),
        dir: dir.clone(),
    };
    let gen_s = t.elapsed().as_secs_f64();

    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let counting = CountingStore::new(Arc::clone(&h.store));
    let counters = counting.counters();
    let store: Arc<dyn BlobStore> = Arc::new(counting);
    let store_for_restore = Arc::clone(&store);
    let task = TaskContext {
        job_name: h.scope.as_str().trim_end_matches('/').into(),
        job_id: "1".into(),
        task_name: "Partition 0".into(),
    };
    let task_for_restore = task.clone();
    let mgr = BlobBackupManager::new(
        store,
        task,
        std::slice::from_ref(&spec),
        Arc::clone(&clock),
        BackupSettings::default(),
    )
    .expect("manager");
    mgr.init(None).await.expect("init");
    let mut ids = CheckpointIdGen::new();

    // Sync step with an empty memtable, five times.
    let mut sync_ms = Vec::new();
    let mut last_cp = None;
    for _ in 0..5 {
        let id = ids.next(clock.now_millis()).expect("id");
        let t = Instant::now();
        db.flush().expect("flush");
        db.checkpoint_to(&spec.checkpoint_dir(id))
            .expect("checkpoint");
        sync_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        last_cp = Some(id);
    }
    let id = last_cp.expect("a checkpoint");
    let cp = spec.checkpoint_dir(id);
    let on_disk = dir_size(&cp);
    let files = std::fs::read_dir(&cp).expect("ls").count();

    let before = counters.snapshot();
    let t = Instant::now();
    let m = mgr
        .upload(
            id,
            &StoreMarkers::new(),
            &BTreeMap::from([("bench".into(), cp)]),
        )
        .await
        .expect("upload");
    let full_s = t.elapsed().as_secs_f64();
    mgr.cleanup(id, &m).await.expect("cleanup");
    let full = counters.snapshot().since(&before);
    let s_full = mgr.last_upload_stats()["bench"];

    // +5 % new data.
    let new_bytes = (size_mib << 20) / 20;
    fill(&db, keys, new_bytes, 2);
    let id2 = ids.next(clock.now_millis()).expect("id");
    let t = Instant::now();
    db.flush().expect("flush");
    db.checkpoint_to(&spec.checkpoint_dir(id2))
        .expect("checkpoint");
    let sync_flush_ms = t.elapsed().as_secs_f64() * 1000.0;
    let before = counters.snapshot();
    let t = Instant::now();
    let m2 = mgr
        .upload(
            id2,
            &StoreMarkers::new(),
            &BTreeMap::from([("bench".into(), spec.checkpoint_dir(id2))]),
        )
        .await
        .expect("upload");
    let incr_s = t.elapsed().as_secs_f64();
    mgr.cleanup(id2, &m2).await.expect("cleanup");
    let incr = counters.snapshot().since(&before);
    let s_incr = mgr.last_upload_stats()["bench"];

    // Restore into an empty dir.
    let cp2 = blobsnap::checkpoint::Checkpoint::V2(blobsnap::checkpoint::CheckpointV2 {
        id: id2,
        input_offsets: Default::default(),
        state_checkpoint_markers: BTreeMap::from([(
            blobsnap::blob::FACTORY_NAME.to_string(),
            m2.clone(),
        )]),
    });
    let target = StoreSpec {
        name: "bench".into(),
        dir: tmp.path().join("restored"),
    };
    // Timed from the index GET (init) to the exchange; the DB open is timed apart.
    let restore = |spec: StoreSpec, hash_cache: bool| {
        let store = Arc::clone(&store_for_restore);
        let task = task_for_restore.clone();
        let cp = cp2.clone();
        async move {
            let r = BlobRestoreManager::new(
                store,
                task,
                std::slice::from_ref(&spec),
                RestoreSettings {
                    hash_cache,
                    ..Default::default()
                },
            )
            .expect("restorer");
            let t = Instant::now();
            r.init(Some(&cp)).await.expect("init");
            r.restore().await.expect("restore");
            (t.elapsed().as_secs_f64(), r.plan_totals()["bench"])
        }
    };
    let before = counters.snapshot();
    let (empty_s, empty_plan) = restore(target.clone(), true).await;
    let empty = counters.snapshot().since(&before);
    // Everything local (a restart on the same host, nothing lost): the restore wrote the
    // files and recorded them in the hash cache, as a dead task's backups had.
    let before = counters.snapshot();
    let (whole_s, whole_plan) = restore(target.clone(), true).await;
    let whole = counters.snapshot().since(&before);
    // Remove about 10 % of the bytes (whole SSTs), then restore again: with the hash cache,
    // then (10 % removed again) without it, every reused file read whole.
    let drop_tenth = |dir: &std::path::Path| {
        let mut removed = 0u64;
        let mut ssts: Vec<_> = std::fs::read_dir(dir)
            .expect("ls")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".sst"))
            .map(|e| (e.path(), e.metadata().expect("stat").len()))
            .collect();
        ssts.sort();
        let total = dir_size(dir);
        for (p, len) in ssts {
            if removed * 10 >= total {
                break;
            }
            std::fs::remove_file(p).expect("rm");
            removed += len;
        }
        (removed, total)
    };
    let (removed, total) = drop_tenth(&target.dir);
    let before = counters.snapshot();
    let (partial_s, partial_plan) = restore(target.clone(), true).await;
    let partial = counters.snapshot().since(&before);
    drop_tenth(&target.dir);
    let (uncached_s, uncached_plan) = restore(target.clone(), false).await;
    let t = Instant::now();
    let opened = blobsnap::local::rocks::RocksStore::open("bench", &target.dir).expect("open");
    let open_ms = t.elapsed().as_secs_f64() * 1000.0;
    drop(opened);

    println!(
        "\n== {name}: {} ({size_mib} MiB of values, generated in {gen_s:.1} s)",
        h.name
    );
    println!(
        "checkpoint: {files} files, {:.1} MiB on disk",
        on_disk as f64 / (1 << 20) as f64
    );
    println!(
        "sync snapshot, empty memtable: median {:.1} ms (runs: {:?})",
        median(sync_ms.clone()),
        sync_ms
            .iter()
            .map(|v| (v * 10.0).round() / 10.0)
            .collect::<Vec<_>>()
    );
    println!(
        "full upload: {:.2} s, {:.1} MiB/s, {} MiB sent, {} PUT requests ({} blobs), hashed {:.1} MiB",
        full_s,
        mbps(full.put.bytes, full_s),
        full.put.bytes >> 20,
        full.put.requests,
        s_full.blobs_uploaded,
        s_full.bytes_hashed as f64 / (1 << 20) as f64
    );
    println!(
        "+5 % ({} MiB written): sync snapshot with memtable flush {:.1} ms; incremental upload {:.3} s, {:.1} MiB sent ({} new blob bytes), {} PUT requests, {} files retained, {} hash-cache hits, hashed {:.1} MiB",
        new_bytes >> 20,
        sync_flush_ms,
        incr_s,
        incr.put.bytes as f64 / (1 << 20) as f64,
        s_incr.bytes_uploaded,
        incr.put.requests,
        s_incr.diff.files_retained,
        s_incr.hash_cache_hits,
        s_incr.bytes_hashed as f64 / (1 << 20) as f64
    );
    println!(
        "restore into an empty dir: {:.2} s, {:.1} MiB/s, {} MiB downloaded, {} GET requests (plan: {} files to download)",
        empty_s,
        mbps(empty.get.bytes, empty_s),
        empty.get.bytes >> 20,
        empty.get.requests,
        empty_plan.files_to_download
    );
    println!(
        "restore into the dir it restored (100 % local): {:.3} s ({:.3} of the empty-dir time), {} bytes downloaded, {} GET requests, {} files proved by the hash cache, {} read ({:.1} MiB)",
        whole_s,
        whole_s / empty_s,
        whole.get.bytes,
        whole.get.requests,
        whole_plan.files_proved_by_cache,
        whole_plan.files_hashed,
        whole_plan.bytes_hashed as f64 / (1 << 20) as f64
    );
    println!(
        "restore into a dir holding {:.0} % of the bytes: {:.2} s ({:.2} of the empty-dir time), {:.1} MiB downloaded ({} missing), {} GET requests, {} files reused, {} proved by the hash cache, {} read ({:.1} MiB)",
        100.0 - removed as f64 * 100.0 / total as f64,
        partial_s,
        partial_s / empty_s,
        partial.get.bytes as f64 / (1 << 20) as f64,
        removed,
        partial.get.requests,
        partial_plan.files_reused,
        partial_plan.files_proved_by_cache,
        partial_plan.files_hashed,
        partial_plan.bytes_hashed as f64 / (1 << 20) as f64
    );
    println!(
        "the same without the hash cache (every reused file read): {:.2} s ({:.2} of the empty-dir time), {} read ({:.1} MiB)",
        uncached_s,
        uncached_s / empty_s,
        uncached_plan.files_hashed,
        uncached_plan.bytes_hashed as f64 / (1 << 20) as f64
    );
    println!("DB open after the restore: {open_ms:.1} ms");
    h.cleanup().await;
}

fn main() {
    let size_mib: u64 = arg("--size-mib")
        .and_then(|s| s.parse().ok())
        .unwrap_or(1024);
    let stores = arg("--stores").unwrap_or_else(|| "local,s3s".into());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        for s in stores.split(',') {
            match s {
                "local" => run(s, support::local().await, size_mib).await,
                // s3s-fs cannot multipart-upload keys as long as blobsnap's (see minio/README.md):
                // single streamed PUTs up to 1 GiB there.
                "s3s" => {
                    let h = support::s3s_with(|c| {
                        c.multipart_threshold = 1 << 30;
                        c.list_page_size = 1000;
                    })
                    .await;
                    run(s, h, size_mib).await
                }
                "external" => run(s, support::external().await, size_mib).await,
                other => panic!("unknown store {other}"),
            }
        }
    });
}
