//! Commit latency under a steady overwrite load with compactions on, without and with
//! pre-upload (issue 33; not a test: it prints numbers).
//!
//! ```sh
//! cargo bench --bench preupload -- [--gib 1] [--secs 300] [--rate-mib 20] \
//!     [--stores local,external] [--modes off,on] [--dir /var/tmp]
//! ```
//!
//! One RocksDB store of `--gib` GiB (sequential 16 KiB values, loaded once, then cloned for
//! each run: SSTs hard-linked, the rest copied), RocksDB's default options (auto compactions
//! on). Each run opens the clone, commits once (the full upload, not counted), then a writer
//! thread overwrites random keys at `--rate-mib` MiB/s (16 KiB values, WAL on) while the task
//! commits every second for `--secs` seconds through the commit manager. Per run:
//!
//! - commit latency, sync stage to checkpoint written (the report's sync + upload + write),
//!   p50 / p99 / p99.9 / max over the steady commits;
//! - bytes PUT during the steady phase (counted below the backend: blobs, indexes, checkpoint
//!   documents, pre-uploads and their waste) ÷ the SST bytes RocksDB finished meanwhile (its
//!   file events);
//! - the writer's achieved rate (the "task's message rate");
//! - with pre-upload: files and bytes pre-uploaded, named by a commit, wasted.
//!
//! `--modes sync-flush,sync-wal` time the sync step alone under the same load (nothing
//! uploaded): RocksDB's checkpoint with the memtable flushed first (today's), and without a
//! flush (`log_size_for_flush = u64::MAX`: the live WAL copied into the checkpoint), with the
//! WAL bytes each checkpoint would carry.
//!
//! Stores: `local` (a directory next to `--dir`), `external` (the server named by
//! `BLOBSNAP_TEST_S3_ENDPOINT`, e.g. a Garage node: `minio/garage.sh`).

#[path = "../tests/support/mod.rs"]
mod support;

mod common;
use common::arg;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blobsnap::backend::{Clock, StoreEngine, StoreSpec, SystemClock, TaskBackupManager as _};
use blobsnap::blob::backup::{BackupSettings, BlobBackupManager};
use blobsnap::blob::FACTORY_NAME;
use blobsnap::blobstore::counting::CountingStore;
use blobsnap::blobstore::BlobStore;
use blobsnap::checkpoint::{BlobCheckpointStore, CheckpointStore, Ssp};
use blobsnap::commit::{Backend, TaskCommitManager};
use blobsnap::layout::JobScope;
use blobsnap::local::events::FileEvent;
use blobsnap::local::rocks::RocksStore;

const VALUE: u64 = 16 << 10;

/// Clone `from` into `to`: SSTs hard-linked (immutable), the rest copied.
fn clone_db(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read db") {
        let e = e.expect("entry");
        let name = e.file_name();
        let n = name.to_string_lossy();
        if n == "LOCK" || n.starts_with("LOG") {
            continue;
        }
        if n.ends_with(".sst") {
            std::fs::hard_link(e.path(), to.join(&name)).expect("link");
        } else {
            std::fs::copy(e.path(), to.join(&name)).expect("copy");
        }
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[i.clamp(1, sorted.len()) - 1]
}

struct Outcome {
    latencies: Vec<f64>,
    /// The sync stages and the uploads alone, ms.
    syncs: Vec<f64>,
    uploads: Vec<f64>,
    /// The most files waiting for the pre-upload at a commit.
    max_queued: u64,
    put_bytes: u64,
    sst_bytes: u64,
    write_rate: f64,
    pre: Option<blobsnap::blob::preupload::PreUploadTotals>,
    first_commit_secs: f64,
}

#[allow(clippy::too_many_arguments)]
async fn run(
    h: &support::Harness,
    template: &Path,
    work: &Path,
    keys: u64,
    secs: u64,
    rate: u64,
    pre_upload: bool,
    label: &str,
) -> Outcome {
    let dir = work.join(format!("db-{label}"));
    let _ = std::fs::remove_dir_all(&dir);
    clone_db(template, &dir);
    let ctx = blobsnap::backend::TaskContext {
        job_name: format!("{}{label}", h.scope.as_str().trim_end_matches('/')),
        job_id: "1".into(),
        task_name: "Partition 0".into(),
    };
    let counting = CountingStore::new(Arc::clone(&h.store));
    let counters = counting.counters();
    let store: Arc<dyn BlobStore> = Arc::new(counting);
    let checkpoints: Arc<dyn CheckpointStore> = Arc::new(BlobCheckpointStore::new(
        Arc::clone(&store),
        JobScope::new(&ctx.job_name, "1").expect("scope"),
    ));
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let unsafe_ok = !checkpoints
        .enforces_exclusive_writes()
        .await
        .expect("probe");
    let (mgr, last) = TaskCommitManager::start(
        ctx.clone(),
        Arc::clone(&checkpoints),
        Arc::clone(&clock),
        2,
        unsafe_ok,
    )
    .await
    .expect("start");
    let mut events = blobsnap::local::events::subscribe(&dir);
    let db = Arc::new(RocksStore::open("state", &dir).expect("open"));
    let spec = StoreSpec {
        name: "state".into(),
        dir: dir.clone(),
    };
    let backup = Arc::new(
        BlobBackupManager::new(
            Arc::clone(&store),
            ctx.clone(),
            std::slice::from_ref(&spec),
            Arc::clone(&clock),
            BackupSettings {
                writer_lease: false,
                pre_upload,
                ..Default::default()
            },
        )
        .expect("backup"),
    );
    backup.init(last.as_ref()).await.expect("init");
    let mgr = mgr
        .with_stores(vec![Arc::clone(&db) as Arc<dyn StoreEngine>])
        .with_backends(
            vec![Backend {
                name: FACTORY_NAME.into(),
                manager: Arc::clone(&backup) as _,
            }],
            last,
        );
    let offset = AtomicU64::new(0);
    let commit = || {
        let n = offset.fetch_add(1, Ordering::Relaxed) + 1;
        mgr.commit(BTreeMap::from([(
            Ssp::new("files", "lines", 0),
            n.to_string(),
        )]))
    };
    let t = Instant::now();
    commit().await.expect("first commit");
    let first_commit_secs = t.elapsed().as_secs_f64();
    while events.try_recv().is_ok() {}

    let (stop, written, writer) = spawn_writer(&db, keys, rate);
    let before = counters.snapshot();
    let started = Instant::now();
    let mut latencies = Vec::new();
    let (mut syncs, mut uploads, mut max_queued) = (Vec::new(), Vec::new(), 0);
    let mut sst_bytes = 0u64;
    let mut next = Instant::now() + Duration::from_secs(1);
    while started.elapsed() < Duration::from_secs(secs) {
        tokio::time::sleep_until(next.into()).await;
        next = (next + Duration::from_secs(1)).max(Instant::now());
        let r = commit().await.expect("commit");
        latencies.push((r.sync_ms + r.upload_ms + r.write_ms) as f64);
        syncs.push(r.sync_ms as f64);
        uploads.push(r.upload_ms as f64);
        if let Some(t) = backup.pre_upload_totals("state") {
            max_queued = max_queued.max(t.queued);
        }
        while let Ok(e) = events.try_recv() {
            if let FileEvent::Finished(p) = e {
                sst_bytes += std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("writer");
    let write_rate = written.load(Ordering::Relaxed) as f64 / elapsed;
    let put_bytes = counters.snapshot().since(&before).put.bytes;
    let pre = backup.pre_upload_totals("state");
    mgr.finish().await.expect("finish");
    drop(mgr);
    drop(backup);
    drop(db);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(PathBuf::from(format!("{}.checkpoints", dir.display())));
    // This run's objects go with it: an 8 GiB store's runs would otherwise fill the disk.
    h.delete_under(JobScope::new(&ctx.job_name, "1").expect("scope").scope())
        .await
        .expect("delete the run's objects");
    latencies.sort_by(f64::total_cmp);
    syncs.sort_by(f64::total_cmp);
    uploads.sort_by(f64::total_cmp);
    Outcome {
        latencies,
        syncs,
        uploads,
        max_queued,
        put_bytes,
        sst_bytes,
        write_rate,
        pre,
        first_commit_secs,
    }
}

/// The writer: random overwrites of `keys` at `rate` bytes/s (16 KiB values, WAL on), paced
/// every 10 ms, until the flag is set. Returns the flag, the bytes written and the thread.
fn spawn_writer(
    db: &Arc<RocksStore>,
    keys: u64,
    rate: u64,
) -> (Arc<AtomicBool>, Arc<AtomicU64>, std::thread::JoinHandle<()>) {
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let (db, s, w) = (Arc::clone(db), Arc::clone(&stop), Arc::clone(&written));
    let writer = std::thread::spawn(move || {
        use rand::{Rng as _, RngCore as _, SeedableRng as _};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let start = Instant::now();
        let mut v = vec![0u8; VALUE as usize];
        while !s.load(Ordering::Relaxed) {
            let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
            if w.load(Ordering::Relaxed) >= due {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            rng.fill_bytes(&mut v);
            let k = rng.random_range(0..keys);
            db.db().put(format!("key{k:012}"), &v).expect("put");
            w.fetch_add(VALUE, Ordering::Relaxed);
        }
    });
    (stop, written, writer)
}

/// The sync step alone, under the same load, once a second for `secs`: a RocksDB checkpoint
/// with `log_size_for_flush` 0 (today's: the memtable flushed first) or `u64::MAX` (no flush:
/// the live WAL copied into the checkpoint, to be replayed at open). Nothing is uploaded.
/// Returns the checkpoint times (ms, sorted) and the WAL bytes each checkpoint carried.
fn probe_sync(
    template: &Path,
    work: &Path,
    keys: u64,
    secs: u64,
    rate: u64,
    log_size_for_flush: u64,
) -> (Vec<f64>, Vec<u64>, f64) {
    let dir = work.join(format!("db-probe-{log_size_for_flush}"));
    let _ = std::fs::remove_dir_all(&dir);
    clone_db(template, &dir);
    let db = Arc::new(RocksStore::open("state", &dir).expect("open"));
    let (stop, written, writer) = spawn_writer(&db, keys, rate);
    let started = Instant::now();
    let (mut times, mut wal) = (Vec::new(), Vec::new());
    let mut next = Instant::now() + Duration::from_secs(1);
    let mut n = 0;
    while started.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        next = (next + Duration::from_secs(1)).max(Instant::now());
        let cp_dir = work.join(format!("probe-cp-{n}"));
        n += 1;
        let t = Instant::now();
        rocksdb::checkpoint::Checkpoint::new(db.db())
            .expect("checkpoint object")
            .create_checkpoint_with_log_size(&cp_dir, log_size_for_flush)
            .expect("checkpoint");
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        wal.push(
            std::fs::read_dir(&cp_dir)
                .expect("list checkpoint")
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
                .map(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
                .sum(),
        );
        let _ = std::fs::remove_dir_all(&cp_dir);
    }
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("writer");
    let rate = written.load(Ordering::Relaxed) as f64 / elapsed;
    drop(db);
    let _ = std::fs::remove_dir_all(&dir);
    times.sort_by(f64::total_cmp);
    (times, wal, rate)
}

fn main() {
    let gib: u64 = arg("--gib").map_or(1, |v| v.parse().expect("--gib"));
    let secs: u64 = arg("--secs").map_or(300, |v| v.parse().expect("--secs"));
    let rate: u64 = arg("--rate-mib").map_or(20, |v| v.parse::<u64>().expect("--rate-mib")) << 20;
    let stores = arg("--stores").unwrap_or_else(|| "local".into());
    let modes = arg("--modes").unwrap_or_else(|| "off,on".into());
    let base = PathBuf::from(arg("--dir").unwrap_or_else(|| "/var/tmp".into()));
    let work = tempfile::tempdir_in(&base).expect("work dir");
    let template = work.path().join("template");
    let t = Instant::now();
    let keys = {
        let db = RocksStore::open("state", &template).expect("open template");
        let n = common::fill(&db, 0, gib << 30, 1);
        db.db().flush().expect("flush");
        n
    };
    eprintln!(
        "loaded {gib} GiB ({keys} keys) in {:.0} s",
        t.elapsed().as_secs_f64()
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        for s in stores.split(',') {
            let h = match s {
                "local" => support::local().await,
                "external" => support::external().await,
                other => panic!("unknown store {other}"),
            };
            for mode in modes.split(',') {
                let on = match mode {
                    "on" => true,
                    "off" => false,
                    "sync-flush" | "sync-wal" => {
                        let log_size = if mode == "sync-wal" { u64::MAX } else { 0 };
                        let (t, wal, w) =
                            probe_sync(&template, work.path(), keys, secs, rate, log_size);
                        let mib = |b: u64| b as f64 / (1 << 20) as f64;
                        println!(
                            "{gib} GiB sync step alone, {mode}: {} checkpoints; ms p50 {:.0} p99 {:.0} p99.9 {:.0} max {:.0}; WAL in the checkpoint: mean {:.1} MiB, max {:.1} MiB; writer {:.1} MiB/s",
                            t.len(),
                            pct(&t, 50.0),
                            pct(&t, 99.0),
                            pct(&t, 99.9),
                            t.last().copied().unwrap_or(f64::NAN),
                            mib(wal.iter().sum::<u64>() / wal.len().max(1) as u64),
                            mib(wal.iter().copied().max().unwrap_or(0)),
                            w / (1 << 20) as f64
                        );
                        continue;
                    }
                    other => panic!("--modes: {other}"),
                };
                let o = run(
                    &h,
                    &template,
                    work.path(),
                    keys,
                    secs,
                    rate,
                    on,
                    &format!("-{mode}"),
                )
                .await;
                let l = &o.latencies;
                println!(
                    "{s} {gib} GiB pre-upload {mode}: {} commits; latency ms p50 {:.0} p99 {:.0} p99.9 {:.0} max {:.0} (sync p50 {:.0} p99 {:.0}, upload p50 {:.0} p99 {:.0}); PUT {:.0} MiB / SST written {:.0} MiB = {:.2}; writer {:.1} MiB/s; first (full) commit {:.1} s{}",
                    l.len(),
                    pct(l, 50.0),
                    pct(l, 99.0),
                    pct(l, 99.9),
                    l.last().copied().unwrap_or(f64::NAN),
                    pct(&o.syncs, 50.0),
                    pct(&o.syncs, 99.0),
                    pct(&o.uploads, 50.0),
                    pct(&o.uploads, 99.0),
                    o.put_bytes as f64 / (1 << 20) as f64,
                    o.sst_bytes as f64 / (1 << 20) as f64,
                    o.put_bytes as f64 / o.sst_bytes.max(1) as f64,
                    o.write_rate / (1 << 20) as f64,
                    o.first_commit_secs,
                    o.pre.filter(|_| on).map_or(String::new(), |t| format!(
                        "; pre-uploaded {} files {:.0} MiB, named {} files {:.0} MiB, wasted {} files {:.0} MiB; queue at a commit ≤ {}",
                        t.files,
                        t.bytes as f64 / (1 << 20) as f64,
                        t.files_used,
                        t.bytes_used as f64 / (1 << 20) as f64,
                        t.files_wasted,
                        t.bytes_wasted as f64 / (1 << 20) as f64,
                        o.max_queued
                    ))
                );
            }
            h.cleanup().await;
        }
    });
}
