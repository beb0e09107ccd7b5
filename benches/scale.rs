//! Hundreds of stores on one host (issue 19 §3; not a test: it prints numbers).
//!
//! ```sh
//! cargo bench --bench scale -- [--tasks 64] [--stores 4] [--minutes 10] [--every-secs 10]
//!     [--mib-per-commit 1] [--store local|s3]
//! ```
//!
//! One process runs `--tasks` tasks of `--stores` RocksDB stores each, every store opened with
//! one shared write-buffer manager (64 MiB) and one shared block cache (64 MiB), all drawing
//! on the process's one transfer budget (`Settings::open_store`, default limits). Every
//! `--every-secs` each task writes ~`--mib-per-commit` MiB of random values into each of its
//! stores but the last quarter of them (the unchanged cohort: those get no writes at all),
//! overwriting a bounded key range (so compaction keeps the live state bounded), and commits:
//! the sync stage (flush, RocksDB checkpoint) in the task's loop, the async stage (upload,
//! checkpoint write, cleanup) beside it, as the runtime does. A commit that comes due while the
//! task's previous one is still in flight waits for it (counted: "fell behind").
//!
//! Reported: commits, fell-behind count, commit time p50/p99/max (due → checkpoint written),
//! requests per task commit by kind (a counting layer), carried-forward store commits, the
//! process's CPU time per task commit and the part of it hashing the new bytes would take (at
//! this machine's measured SHA-256 rate), blobsnap's own heap peak (a counting allocator,
//! sampled every 50 ms) beside RocksDB's shared memory (write buffers + block cache), the
//! process's peak RSS, and the CPU of one task commit whose stores are all unchanged.
//!
//! `--store local` (the default): a local directory store under a temp dir. `--store s3`: the
//! server of `BLOBSNAP_TEST_S3_ENDPOINT` (`minio/localstack.sh env`; the bucket
//! `BLOBSNAP_TEST_S3_BUCKET` must exist).

mod common;
use common::{arg, median, peak_rss_mib};

use std::alloc::System;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use blobsnap::backend::{
    StateBackendAdmin as _, StateBackendFactory, StoreEngine, StoreSpec, SystemClock, TaskContext,
};
use blobsnap::blob::factory::BlobStateBackendFactory;
use blobsnap::blob::restore::RestoreSettings;
use blobsnap::blobstore::counting::CountingStore;
use blobsnap::blobstore::BlobStore;
use blobsnap::checkpoint::{BlobCheckpointStore, CheckpointStore, Ssp};
use blobsnap::commit::{Backend, TaskCommitManager};
use blobsnap::layout::JobScope;
use blobsnap::local::rocks::RocksStore;
use rand::{RngCore as _, SeedableRng as _};
use stats_alloc::{StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const VALUE: usize = 16 << 10;
/// Keys per store: writes overwrite these, so the live state stays near 2× this × VALUE.
const KEYS: u64 = 256;

/// Bytes the process's Rust code holds now (the allocator counts a reallocation's growth as
/// allocated and its shrinking as deallocated).
fn heap_now() -> u64 {
    let s = GLOBAL.stats();
    s.bytes_allocated.saturating_sub(s.bytes_deallocated) as u64
}

fn cpu_secs() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// One task: its stores, its commit manager, its backup manager.
struct Task {
    name: String,
    stores: Vec<Arc<RocksStore>>,
    commits: Arc<TaskCommitManager>,
    backup: Arc<dyn blobsnap::backend::TaskBackupManager>,
}

fn write_round(db: &RocksStore, rng: &mut rand::rngs::StdRng, bytes: u64) {
    let mut batch = rocksdb::WriteBatch::default();
    let mut wo = rocksdb::WriteOptions::default();
    wo.disable_wal(true);
    for _ in 0..(bytes / VALUE as u64).max(1) {
        let mut v = vec![0u8; VALUE];
        rng.fill_bytes(&mut v);
        batch.put(format!("key{:06}", rng.next_u64() % KEYS), v);
    }
    db.db().write_opt(batch, &wo).expect("write");
}

fn main() {
    let tasks_n: usize = arg("--tasks").map_or(64, |v| v.parse().expect("--tasks N"));
    let stores_n: usize = arg("--stores").map_or(4, |v| v.parse().expect("--stores N"));
    let minutes: f64 = arg("--minutes").map_or(10.0, |v| v.parse().expect("--minutes M"));
    let every = Duration::from_secs_f64(
        arg("--every-secs").map_or(10.0, |v| v.parse().expect("--every-secs S")),
    );
    let mib: f64 = arg("--mib-per-commit").map_or(1.0, |v| v.parse().expect("--mib-per-commit"));
    let s3 = arg("--store").as_deref() == Some("s3");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run(tasks_n, stores_n, minutes, every, mib, s3));
}

async fn run(tasks_n: usize, stores_n: usize, minutes: f64, every: Duration, mib: f64, s3: bool) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut settings = blobsnap::config::Settings::load(None).expect("settings");
    if s3 {
        settings.store.kind = blobsnap::config::StoreKind::S3;
        if let Ok(b) = std::env::var("BLOBSNAP_TEST_S3_BUCKET") {
            settings.s3.bucket = b;
        }
        if let Ok(e) = std::env::var("BLOBSNAP_TEST_S3_ENDPOINT") {
            settings.s3.endpoint = Some(e);
            settings.s3.path_style = true;
        }
    } else {
        settings.store.kind = blobsnap::config::StoreKind::Local;
        settings.store.local_dir = tmp.path().join("store");
    }
    let opened = settings.open_store().await.expect("open the blob store");
    let counting = CountingStore::new(opened);
    let counters = counting.counters();
    let store: Arc<dyn BlobStore> = Arc::new(counting);
    let job_id = format!("{:08x}", rand::random::<u32>());
    let admin = blobsnap::blob::admin::BlobStoreAdmin::new(
        Arc::clone(&store),
        None,
        "scale",
        &job_id,
        "bench",
    )
    .expect("admin");
    admin.create_resources().await.expect("resources");
    let backend: Arc<dyn StateBackendFactory> = Arc::new(BlobStateBackendFactory::new(
        Arc::clone(&store),
        None,
        Default::default(),
        RestoreSettings::default(),
        "bench",
    ));
    let checkpoints: Arc<dyn CheckpointStore> = Arc::new(BlobCheckpointStore::new(
        Arc::clone(&store),
        JobScope::new("scale", &job_id).expect("scope"),
    ));

    // RocksDB's memory: one write-buffer manager and one block cache for every store.
    let cache = rocksdb::Cache::new_lru_cache(64 << 20);
    let wbm = rocksdb::WriteBufferManager::new_write_buffer_manager_with_cache(
        64 << 20,
        false,
        cache.clone(),
    );
    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(true);
    opts.set_write_buffer_manager(&wbm);
    let mut table = rocksdb::BlockBasedOptions::default();
    table.set_block_cache(&cache);
    opts.set_block_based_table_factory(&table);
    opts.set_max_background_jobs(2);

    let mut tasks = Vec::new();
    for t in 0..tasks_n {
        let ctx = TaskContext {
            job_name: "scale".into(),
            job_id: job_id.clone(),
            task_name: format!("Partition {t}"),
        };
        let specs: Vec<StoreSpec> = (0..stores_n)
            .map(|s| StoreSpec {
                name: format!("store{s}"),
                dir: tmp.path().join(format!("state/t{t}/store{s}")),
            })
            .collect();
        let stores: Vec<Arc<RocksStore>> = specs
            .iter()
            .map(|s| Arc::new(RocksStore::open_with(&s.name, &s.dir, &opts).expect("open store")))
            .collect();
        let (commits, last) = TaskCommitManager::start(
            ctx.clone(),
            Arc::clone(&checkpoints),
            Arc::new(SystemClock),
            2,
            false,
        )
        .await
        .expect("claim");
        let backup = backend
            .backup_manager(&ctx, &specs, Arc::new(SystemClock))
            .expect("backup manager");
        backup.init(last.as_ref()).await.expect("init");
        let commits = commits
            .with_stores(
                stores
                    .iter()
                    .map(|s| Arc::clone(s) as Arc<dyn StoreEngine>)
                    .collect(),
            )
            .with_backends(
                vec![Backend {
                    name: backend.name().to_string(),
                    manager: Arc::clone(&backup),
                }],
                last,
            );
        tasks.push(Task {
            name: ctx.task_name,
            stores,
            commits: Arc::new(commits),
            backup,
        });
    }

    // SHA-256's rate on this machine, to tell hashing from the rest of the CPU.
    let sha_secs_per_byte = {
        let buf = vec![7u8; 64 << 20];
        let t = Instant::now();
        std::hint::black_box(blobsnap::digest::Sha256::of(&buf));
        t.elapsed().as_secs_f64() / buf.len() as f64
    };

    let stop = Arc::new(AtomicBool::new(false));
    let heap_peak = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (stop, heap_peak) = (Arc::clone(&stop), Arc::clone(&heap_peak));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                heap_peak.fetch_max(heap_now(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let rocks_peak = Arc::new(AtomicU64::new(0));

    println!(
        "scale: {tasks_n} tasks × {stores_n} stores ({} unchanged per task), {:.1} MiB per changed store every {:.0} s, {minutes} min, store {}",
        stores_n / 4,
        mib,
        every.as_secs_f64(),
        if s3 { "s3" } else { "local" }
    );
    let before = counters.snapshot();
    let cpu0 = cpu_secs();
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(minutes * 60.0);
    let latencies = Arc::new(Mutex::new(Vec::<f64>::new()));
    let fell_behind = Arc::new(AtomicU64::new(0));
    let carried = Arc::new(AtomicU64::new(0));
    let new_bytes = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for (t, task) in tasks.iter().enumerate() {
        let (latencies, fell_behind, carried, new_bytes, failures) = (
            Arc::clone(&latencies),
            Arc::clone(&fell_behind),
            Arc::clone(&carried),
            Arc::clone(&new_bytes),
            Arc::clone(&failures),
        );
        let (stores, commits, backup, name) = (
            task.stores.clone(),
            Arc::clone(&task.commits),
            Arc::clone(&task.backup),
            task.name.clone(),
        );
        let (wbm, cache, rocks_peak) = (wbm.clone(), cache.clone(), Arc::clone(&rocks_peak));
        handles.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64);
            // Tasks start spread over the interval, as a job's do.
            let mut due = Instant::now() + every.mul_f64(t as f64 / tasks_n as f64);
            let mut in_flight: Option<tokio::task::JoinHandle<()>> = None;
            let mut offset = 0u64;
            let changed = stores.len() - stores.len() / 4;
            while due < deadline {
                tokio::time::sleep_until(due.into()).await;
                {
                    let (stores, seed) = (stores.clone(), rng.next_u64());
                    tokio::task::spawn_blocking(move || {
                        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
                        for db in &stores[..changed] {
                            write_round(db, &mut rng, (mib * (1 << 20) as f64) as u64);
                        }
                    })
                    .await
                    .expect("writes");
                }
                if let Some(h) = in_flight.take() {
                    if !h.is_finished() {
                        fell_behind.fetch_add(1, Ordering::Relaxed);
                    }
                    h.await.expect("async stage");
                }
                offset += 1;
                let offsets =
                    BTreeMap::from([(Ssp::new("bench", "in", t as u32), offset.to_string())]);
                let pending = match commits.sync_stage(offsets).await {
                    Ok(p) => p,
                    Err(e) => {
                        eprintln!("{name}: sync stage failed: {e}");
                        failures.fetch_add(1, Ordering::Relaxed);
                        due += every;
                        continue;
                    }
                };
                let (commits, backup, latencies, carried, new_bytes, failures, name) = (
                    Arc::clone(&commits),
                    Arc::clone(&backup),
                    Arc::clone(&latencies),
                    Arc::clone(&carried),
                    Arc::clone(&new_bytes),
                    Arc::clone(&failures),
                    name.clone(),
                );
                let due_at = due;
                in_flight = Some(tokio::spawn(async move {
                    match commits.async_stage(pending).await {
                        Ok(_) => {
                            latencies
                                .lock()
                                .expect("latencies")
                                .push(due_at.elapsed().as_secs_f64());
                            for u in backup.last_upload().values() {
                                if u.requests == 0 {
                                    carried.fetch_add(1, Ordering::Relaxed);
                                }
                                new_bytes.fetch_add(u.bytes_uploaded, Ordering::Relaxed);
                            }
                        }
                        Err(e) => {
                            eprintln!("{name}: commit failed: {e}");
                            failures.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }));
                let rocks = wbm.get_usage() as u64 + cache.get_usage() as u64;
                rocks_peak.fetch_max(rocks, Ordering::Relaxed);
                due += every;
            }
            if let Some(h) = in_flight {
                h.await.expect("async stage");
            }
        }));
    }
    for h in handles {
        h.await.expect("task");
    }
    let wall = started.elapsed().as_secs_f64();
    let cpu = cpu_secs() - cpu0;
    let c = counters.snapshot().since(&before);
    stop.store(true, Ordering::Relaxed);
    sampler.join().expect("sampler");

    let lat = latencies.lock().expect("latencies").clone();
    let commits = lat.len() as f64;
    let per = |n: u64| n as f64 / commits.max(1.0);
    let hashing = new_bytes.load(Ordering::Relaxed) as f64 * sha_secs_per_byte;
    println!(
        "commits: {} task commits in {wall:.0} s ({} failed), fell behind {}",
        lat.len(),
        failures.load(Ordering::Relaxed),
        fell_behind.load(Ordering::Relaxed)
    );
    println!(
        "commit time (due → checkpoint written): p50 {:.3} s, p99 {:.3} s, max {:.3} s",
        median(lat.clone()),
        percentile(lat.clone(), 0.99),
        percentile(lat, 1.0)
    );
    println!(
        "requests per task commit: PUT {:.2}, GET {:.2}, HEAD {:.2}, LIST {:.2}, DeleteObjects {:.2}; store commits carried forward (0 requests): {} of {}",
        per(c.put.calls),
        per(c.get.calls),
        per(c.head.calls),
        per(c.list.calls),
        per(c.delete.calls),
        carried.load(Ordering::Relaxed),
        commits as u64 * stores_n as u64
    );
    println!(
        "CPU: {:.1} ms per task commit (the process, RocksDB's flushes and compactions and the bench's own writes included); hashing the {:.0} MiB uploaded would take {:.1} ms of it ({:.0} MiB/s SHA-256)",
        cpu / commits.max(1.0) * 1000.0,
        new_bytes.load(Ordering::Relaxed) as f64 / (1 << 20) as f64,
        hashing / commits.max(1.0) * 1000.0,
        1.0 / sha_secs_per_byte / (1 << 20) as f64
    );
    println!(
        "memory: blobsnap's heap peak {:.0} MiB (counting allocator: every Rust allocation of the process); RocksDB's shared write buffers + block cache peak {:.0} MiB (capped at 64 + 64); peak RSS {:.0} MiB",
        heap_peak.load(Ordering::Relaxed) as f64 / (1 << 20) as f64,
        rocks_peak.load(Ordering::Relaxed) as f64 / (1 << 20) as f64,
        peak_rss_mib()
    );

    // One task commit with every store unchanged, in a quiet process: its CPU. RocksDB may
    // still be compacting what the last round flushed (a compaction's output is a change the
    // next commit uploads): wait for it, and let one commit take it up first.
    let task = &tasks[0];
    for db in &task.stores {
        while db
            .db()
            .property_int_value("rocksdb.num-running-compactions")
            .ok()
            .flatten()
            .unwrap_or(0)
            > 0
            || db
                .db()
                .property_int_value("rocksdb.compaction-pending")
                .ok()
                .flatten()
                .unwrap_or(0)
                > 0
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let warm = BTreeMap::from([(Ssp::new("bench", "in", 0), "idle-warm-up".to_string())]);
    task.commits.commit(warm).await.expect("warm-up commit");
    let mut samples = Vec::new();
    let mut with_requests = 0;
    for i in 0..20u64 {
        let offsets = BTreeMap::from([(Ssp::new("bench", "in", 0), format!("idle-{i}"))]);
        let c0 = cpu_secs();
        task.commits.commit(offsets).await.expect("idle commit");
        samples.push((cpu_secs() - c0) * 1000.0);
        if task.backup.last_upload().values().any(|u| u.requests > 0) {
            with_requests += 1;
        }
    }
    println!(
        "an unchanged task commit ({stores_n} stores; flush, RocksDB checkpoint, scan, checkpoint PUT and trim included): median {:.2} ms of CPU ({:.2} ms per store); {with_requests} of 20 made store requests",
        median(samples.clone()),
        median(samples) / stores_n as f64
    );
}
