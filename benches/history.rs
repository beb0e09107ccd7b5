//! State through time at scale (issue 32 §4 and §5; not a test: it prints numbers).
//!
//! ```sh
//! cargo bench --bench history -- [--only day|fork] [--commits 86400] [--every-secs 1] [--dir D]
//!     [--policy "last 120, every 1m for 12h, every 5m for 1d"] [--ssts 500] [--sst-mib 16]
//! ```
//!
//! **day**: a RocksDB store (one task, the local blob store) commits every `--every-secs`
//! seconds of a virtual clock, `--commits` times, each commit after a batch of writes (RocksDB flushes
//! and compacts as it does), under the tiered `--policy`. Then: the restorable points (the
//! task's retained checkpoints, each checked whole: index present, every blob present with
//! its size); the stored blob bytes against the live bytes and the distinct files the
//! retained points name (a leak or a duplicate would show as a difference); the metadata
//! (indexes and checkpoint documents) against the data; and `blobsnap restore` of `@TIME`
//! (the middle of the window) against `latest`, each 5 times into a fresh directory, medians.
//! Between the two, one sweep (grace 0: the bench's writer has stopped) and the stored blobs
//! again: what no retained point names should be gone.
//!
//! **fork**: a source snapshot of `--ssts` files of `--sst-mib` MiB (random bytes) is uploaded
//! and saved; then 5 forks of it are made (`blob::fork::fork_task`, as `start-from =
//! "savepoint:JOB/ID/NAME"` does at a task's first start), each timed and counted by kind of
//! request and bytes written.

mod common;
use common::{arg, median};

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blobsnap::backend::{
    Clock, StoreEngine, StoreMarkers, StoreSpec, SystemClock, TaskBackupManager as _, TaskContext,
};
use blobsnap::blob::backup::{BackupSettings, BlobBackupManager};
use blobsnap::blob::{fork, load_snapshot, savepoint, Expected, FACTORY_NAME};
use blobsnap::blobstore::counting::CountingStore;
use blobsnap::blobstore::BlobStore;
use blobsnap::checkpoint::{
    BlobCheckpointStore, Checkpoint, CheckpointIdGen, CheckpointStore, CheckpointV2, Ssp,
};
use blobsnap::commit::{Backend, TaskCommitManager};
use blobsnap::layout::{parse, JobScope, KeyKind};
use blobsnap::local::rocks::RocksStore;
use futures::TryStreamExt as _;

const TASK: &str = "Partition 0";

#[derive(Debug)]
struct VClock(AtomicU64);

impl Clock for VClock {
    fn now_millis(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

fn main() {
    let only = arg("--only");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        if only.as_deref() != Some("fork") {
            day().await;
        }
        if only.as_deref() != Some("day") {
            forks().await;
        }
    });
}

async fn day() {
    let commits: u64 = arg("--commits")
        .map(|v| v.parse().expect("--commits N"))
        .unwrap_or(86_400);
    let every_secs: u64 = arg("--every-secs")
        .map(|v| v.parse().expect("--every-secs N"))
        .unwrap_or(1);
    let policy_text = arg("--policy")
        .unwrap_or_else(|| "last 120, every 1m for 12h, every 5m for 1d".to_string());
    let policy: blobsnap::retention::RetentionPolicy = policy_text.parse().expect("--policy");
    let tmp = match arg("--dir") {
        Some(d) => tempfile::tempdir_in(d).expect("tempdir in --dir"),
        None => tempfile::tempdir().expect("tempdir"),
    };
    let root = tmp.path().join("store");
    let store: Arc<dyn BlobStore> =
        Arc::new(blobsnap::blobstore::local::LocalStore::new(&root).expect("store"));
    let clock = Arc::new(VClock(AtomicU64::new(1_800_000_000_000)));
    let vclock: Arc<dyn Clock> = clock.clone();
    let ctx = TaskContext {
        job_name: "day".into(),
        job_id: "1".into(),
        task_name: TASK.into(),
    };
    let dir = tmp.path().join("state").join("counts");
    let db = Arc::new(RocksStore::open("counts", &dir).expect("rocksdb"));
    let job = JobScope::new("day", "1").expect("scope");
    let checkpoints: Arc<dyn CheckpointStore> =
        Arc::new(BlobCheckpointStore::new(Arc::clone(&store), job.clone()));
    let (mgr, last) = TaskCommitManager::start(
        ctx.clone(),
        checkpoints,
        Arc::clone(&vclock),
        policy.last,
        false,
    )
    .await
    .expect("start");
    let backup = Arc::new(
        BlobBackupManager::new(
            Arc::clone(&store),
            ctx.clone(),
            &[StoreSpec {
                name: "counts".into(),
                dir: dir.clone(),
            }],
            Arc::clone(&vclock),
            BackupSettings {
                retention: policy.last,
                tiered_retention: true,
                writer_lease: false,
                gc_grace: Duration::from_secs(3600),
                ..Default::default()
            },
        )
        .expect("backup manager"),
    );
    backup.init(last.as_ref()).await.expect("init");
    let mgr = mgr
        .with_retention_tiers(policy.tiers.clone())
        .with_stores(vec![Arc::clone(&db) as Arc<dyn StoreEngine>])
        .with_backends(
            vec![Backend {
                name: FACTORY_NAME.into(),
                manager: backup,
            }],
            last,
        );
    // Each second: 64 writes of 256-byte values over a key space of 200,000 (updates and
    // inserts), so RocksDB flushes an SST per commit and compacts now and then.
    let started = Instant::now();
    let mut stage_ms = [0u64; 4];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for s in 0..commits {
        let mut batch = rocksdb::WriteBatch::default();
        for _ in 0..64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            batch.put(format!("key{:08}", x % 200_000), x.to_le_bytes().repeat(32));
        }
        db.db().write(batch).expect("write");
        clock.0.fetch_add(every_secs * 1_000, Ordering::Relaxed);
        let offsets = BTreeMap::from([(Ssp::new("bench", "in", 0), s.to_string())]);
        let r = mgr.commit(offsets).await.expect("commit");
        for (sum, ms) in stage_ms
            .iter_mut()
            .zip([r.sync_ms, r.upload_ms, r.write_ms, r.cleanup_ms])
        {
            *sum += ms;
        }
        if s % 1_000 == 999 {
            let [sync, upload, write, cleanup] =
                std::mem::take(&mut stage_ms).map(|ms| ms as f64 / 1e3);
            eprintln!(
                "day: {} commits, {:.0} s (the last 1000: sync {sync:.0} s, upload {upload:.0} s, checkpoint write {write:.0} s, cleanup {cleanup:.0} s)",
                s + 1,
                started.elapsed().as_secs_f64()
            );
        }
    }
    let commit_secs = started.elapsed().as_secs_f64();

    // What is kept, and what it costs.
    let cps = BlobCheckpointStore::new(Arc::clone(&store), job.clone());
    let history = cps.history(TASK, usize::MAX).await.expect("history");
    let mut points = BTreeSet::new();
    let mut named: HashMap<String, u64> = HashMap::new();
    let mut index_keys = BTreeSet::new();
    let mut live_bytes = 0u64;
    for (i, c) in history.iter().enumerate() {
        let v2 = c.checkpoint.as_v2().expect("v2");
        points.insert(v2.id);
        let marker = v2.marker(FACTORY_NAME, "counts").expect("marker");
        let who = Expected {
            job_name: "day",
            job_id: "1",
            task_name: TASK,
            store_name: "counts",
        };
        let snap = load_snapshot(store.as_ref(), &who, marker)
            .await
            .expect("a retained point loads");
        index_keys.insert(snap.scope.index_key(&snap.marker).expect("key"));
        let mut size = 0;
        for (_, f) in snap.index.present_files() {
            size += f.file_metadata.size;
            for b in &f.blobs {
                let key = snap.blobs.key(&b.blob_id).expect("key");
                let meta = store.head(&key).await.expect("a retained blob exists");
                assert_eq!(meta.size, f.file_metadata.size, "{key}");
                named.insert(key.as_str().to_string(), meta.size);
            }
        }
        if i == 0 {
            live_bytes = size;
        }
    }
    let (mut blob_bytes, mut blob_objects, mut index_bytes, mut doc_bytes) =
        (0u64, 0u64, 0u64, 0u64);
    let mut by_sha: HashMap<String, u64> = HashMap::new();
    let listing: Vec<_> = store.list(job.scope()).try_collect().await.expect("list");
    for m in &listing {
        match parse(&m.key).map(|p| p.kind) {
            Some(KeyKind::Blob { sha256, .. }) => {
                blob_bytes += m.size;
                blob_objects += 1;
                *by_sha.entry(sha256.to_string()).or_default() += 1;
            }
            Some(KeyKind::Index { .. }) => index_bytes += m.size,
            Some(KeyKind::Checkpoint { .. }) => doc_bytes += m.size,
            _ => {}
        }
    }
    let duplicated: u64 = by_sha.values().map(|n| n.saturating_sub(1)).sum();
    let named_bytes: u64 = named.values().sum();
    println!("day: {commits} commits (one every {every_secs} s of a virtual clock: {:.1} h) in {commit_secs:.0} s, policy {policy_text:?}", (commits * every_secs) as f64 / 3600.0);
    println!(
        "day: {} restorable points (each loaded, every blob HEADed with its size); {} checkpoint documents",
        points.len(),
        history.len()
    );
    println!(
        "day: stored blobs {} objects / {:.1} MiB; named by the retained points {} / {:.1} MiB; live (latest) {:.1} MiB; distinct SSTs born in the window beyond the live ones {:.1} MiB; blobs stored twice (same content, two keys): {duplicated}",
        blob_objects,
        mib(blob_bytes),
        named.len(),
        mib(named_bytes),
        mib(live_bytes),
        mib(named_bytes.saturating_sub(live_bytes)),
    );
    println!(
        "day: metadata {:.2} MiB ({} indexes {:.2} MiB + documents {:.2} MiB) = {:.2} % of the stored data",
        mib(index_bytes + doc_bytes),
        index_keys.len(),
        mib(index_bytes),
        mib(doc_bytes),
        100.0 * (index_bytes + doc_bytes) as f64 / blob_bytes.max(1) as f64
    );
    drop(mgr);
    drop(db);

    // One sweep (the job has stopped: no upload is in flight, so no grace is needed), then
    // the listing again: what no retained point names should be gone, all they name kept.
    let report = blobsnap::blob::gc::sweep(
        &store,
        &blobsnap::blob::gc::SweepSettings {
            job_name: "day".into(),
            job_id: "1".into(),
            task: None,
            store: None,
            grace: Duration::ZERO,
        },
        false,
        &mut |_| {},
    )
    .await
    .expect("sweep");
    let (mut kept_objects, mut kept_bytes, mut unnamed) = (0u64, 0u64, 0u64);
    let after: Vec<_> = store.list(job.scope()).try_collect().await.expect("list");
    for m in &after {
        if let Some(KeyKind::Blob { .. }) = parse(&m.key).map(|p| p.kind) {
            kept_objects += 1;
            kept_bytes += m.size;
            unnamed += u64::from(!named.contains_key(m.key.as_str()));
        }
    }
    println!(
        "day: one sweep deleted {} objects ({:.1} MiB); stored blobs now {kept_objects} objects / {:.1} MiB, named by no retained point: {unnamed}",
        report.deleted,
        mib(report.plan.bytes),
        mib(kept_bytes),
    );

    // Restores: latest against @TIME of the middle of the window.
    let mid = history[history.len() / 2]
        .checkpoint
        .as_v2()
        .expect("v2")
        .id
        .millis();
    let at = format!("@{}", blobsnap::blob::history::utc(mid));
    let bin = env!("CARGO_BIN_EXE_blobsnap");
    let mut times: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for round in 0..5 {
        for r in ["latest", at.as_str()] {
            let to = tmp.path().join(format!("r-{round}-{}", r.len()));
            let t = Instant::now();
            let out = std::process::Command::new(bin)
                .arg("--local")
                .arg(&root)
                .args([
                    "restore", "--job", "day", "--task", TASK, "--store", "counts", "--to",
                ])
                .arg(&to)
                .arg(r)
                .output()
                .expect("blobsnap restore");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            times
                .entry(if r == "latest" { "latest" } else { "@TIME" })
                .or_default()
                .push(t.elapsed().as_secs_f64());
            let size = common::dir_size(&to);
            if round == 0 {
                println!("day: restore {r}: {:.1} MiB", mib(size));
            }
        }
    }
    let latest = median(times["latest"].clone());
    let at_time = median(times["@TIME"].clone());
    println!(
        "day: blobsnap restore, median of 5: latest {latest:.3} s, {at} {at_time:.3} s ({:+.1} %)",
        100.0 * (at_time - latest) / latest
    );
}

async fn forks() {
    let ssts: u64 = arg("--ssts")
        .map(|v| v.parse().expect("--ssts N"))
        .unwrap_or(500);
    let sst_mib: u64 = arg("--sst-mib")
        .map(|v| v.parse().expect("--sst-mib N"))
        .unwrap_or(16);
    let tmp = match arg("--dir") {
        Some(d) => tempfile::tempdir_in(d).expect("tempdir in --dir"),
        None => tempfile::tempdir().expect("tempdir"),
    };
    let local: Arc<dyn BlobStore> = Arc::new(
        blobsnap::blobstore::local::LocalStore::new(tmp.path().join("store")).expect("store"),
    );
    let counting = CountingStore::new(Arc::clone(&local));
    let counters = counting.counters();
    let store: Arc<dyn BlobStore> = Arc::new(counting);
    let dir = tmp.path().join("cp");
    std::fs::create_dir_all(&dir).expect("dir");
    let t = Instant::now();
    write_files(&dir, ssts, sst_mib);
    let src = BlobBackupManager::new(
        Arc::clone(&store),
        TaskContext {
            job_name: "source".into(),
            job_id: "1".into(),
            task_name: TASK.into(),
        },
        &[StoreSpec {
            name: "counts".into(),
            dir: tmp.path().join("live"),
        }],
        Arc::new(SystemClock),
        BackupSettings {
            writer_lease: false,
            ..Default::default()
        },
    )
    .expect("manager");
    src.init(None).await.expect("init");
    let id = CheckpointIdGen::new()
        .next(SystemClock.now_millis())
        .expect("id");
    let m: StoreMarkers = src
        .upload(
            id,
            &StoreMarkers::new(),
            &BTreeMap::from([("counts".to_string(), dir.clone())]),
        )
        .await
        .expect("upload");
    src.cleanup(id, &m).await.expect("cleanup");
    let cp = Checkpoint::V2(CheckpointV2 {
        id,
        input_offsets: BTreeMap::new(),
        state_checkpoint_markers: BTreeMap::from([(FACTORY_NAME.to_string(), m)]),
    });
    BlobCheckpointStore::new(
        Arc::clone(&store),
        JobScope::new("source", "1").expect("scope"),
    )
    .write(TASK, 1, "bench", &cp)
    .await
    .expect("checkpoint");
    savepoint::create(
        &store,
        "source",
        "1",
        "base",
        &"latest".parse().expect("ref"),
    )
    .await
    .expect("savepoint");
    println!(
        "fork: source of {ssts} files × {sst_mib} MiB = {:.1} GiB written, uploaded and saved in {:.0} s",
        (ssts * sst_mib) as f64 / 1024.0,
        t.elapsed().as_secs_f64()
    );
    let source: fork::ForkSource = "source/1/base".parse().expect("source");
    let mut secs = Vec::new();
    for i in 0..5 {
        let before = counters.snapshot();
        let t = Instant::now();
        let f = fork::fork_task(
            &store,
            &source,
            "fork",
            &i.to_string(),
            TASK,
            Duration::from_secs(3600),
        )
        .await
        .expect("fork");
        secs.push(t.elapsed().as_secs_f64());
        let c = counters.snapshot().since(&before);
        if i == 0 {
            println!(
                "fork: {} store(s), {} files, {:.1} GiB borrowed; requests: GET {} ({} bytes), HEAD {}, PUT {} ({} bytes), LIST {}, DELETE {}",
                f.stores,
                f.files,
                f.bytes as f64 / (1u64 << 30) as f64,
                c.get.calls,
                c.get.bytes,
                c.head.calls,
                c.put.calls,
                c.put.bytes,
                c.list.calls,
                c.delete.calls
            );
        }
    }
    println!(
        "fork: time per fork (5 forks, one store each): median {:.4} s, max {:.4} s",
        median(secs.clone()),
        secs.iter().cloned().fold(0.0, f64::max)
    );
}

/// `n` files of `mib` MiB of random bytes.
fn write_files(dir: &Path, n: u64, mib: u64) {
    use rand::{RngCore as _, SeedableRng as _};
    use std::io::Write as _;
    let mut rng = rand::rngs::StdRng::seed_from_u64(32);
    let mut buf = vec![0u8; 1 << 20];
    for i in 0..n {
        let mut f = std::fs::File::create(dir.join(format!("{:06}.sst", i + 1))).expect("create");
        for _ in 0..mib {
            rng.fill_bytes(&mut buf);
            f.write_all(&buf).expect("write");
        }
    }
}
