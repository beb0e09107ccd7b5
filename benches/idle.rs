//! What an unchanged store costs at a commit, step by step (issue 19 §3; not a test: it prints
//! numbers).
//!
//! ```sh
//! cargo bench --bench idle -- [--stores 4] [--ssts 24] [--rounds 200]
//! ```
//!
//! One task of `--stores` RocksDB stores, each holding `--ssts` flushed SSTs, on the local
//! store, in a single-threaded runtime. After a first commit uploads everything, nothing is
//! written any more, and each step of an unchanged commit is timed alone, in CPU time of the
//! whole process (user + system, every thread: RocksDB's own included), median over
//! `--rounds`: the store's flush (an empty memtable), its RocksDB checkpoint into a fresh
//! directory, the backend's upload of that unchanged directory (scan, the hash-cache lookups
//! and the small files' hashes, the diff that carries the marker forward), and a whole task
//! commit through the commit manager (every store: sync stage, uploads, the checkpoint PUT,
//! the trim, the cleanup, the removal of the older checkpoint directories).

mod common;
use common::{arg, median};

use std::collections::BTreeMap;
use std::sync::Arc;

use blobsnap::backend::{
    StoreEngine, StoreMarkers, StoreSpec, SystemClock, TaskBackupManager, TaskContext,
};
use blobsnap::blob::backup::{BackupSettings, BlobBackupManager};
use blobsnap::blob::FACTORY_NAME;
use blobsnap::blobstore::local::LocalStore;
use blobsnap::blobstore::BlobStore;
use blobsnap::checkpoint::{BlobCheckpointStore, CheckpointIdGen, CheckpointStore, Ssp};
use blobsnap::commit::{Backend, TaskCommitManager};
use blobsnap::layout::JobScope;
use blobsnap::local::rocks::RocksStore;

fn cpu_secs() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

/// Median CPU milliseconds of `rounds` runs of `f`.
async fn cpu_ms<F, Fut>(rounds: usize, mut f: F) -> f64
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut v = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let c0 = cpu_secs();
        f(i).await;
        v.push((cpu_secs() - c0) * 1e3);
    }
    median(v)
}

fn main() {
    let stores_n: usize = arg("--stores").map_or(4, |v| v.parse().expect("--stores"));
    let ssts: u64 = arg("--ssts").map_or(24, |v| v.parse().expect("--ssts"));
    let rounds: usize = arg("--rounds").map_or(200, |v| v.parse().expect("--rounds"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run(stores_n, ssts, rounds));
}

async fn run(stores_n: usize, ssts: u64, rounds: usize) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store: Arc<dyn BlobStore> =
        Arc::new(LocalStore::new(tmp.path().join("store")).expect("local store"));
    let ctx = TaskContext {
        job_name: "idle".into(),
        job_id: "1".into(),
        task_name: "Partition 0".into(),
    };
    let specs: Vec<StoreSpec> = (0..stores_n)
        .map(|i| StoreSpec {
            name: format!("s{i}"),
            dir: tmp.path().join(format!("s{i}")),
        })
        .collect();
    let mut dbs = Vec::new();
    for spec in &specs {
        let db = RocksStore::open(&spec.name, &spec.dir).expect("open");
        // `--ssts` flushed files of 64 KiB values; auto compaction would merge them.
        db.db()
            .set_options(&[("disable_auto_compactions", "true")])
            .expect("options");
        for f in 0..ssts {
            for k in 0..4u64 {
                let v = vec![(f * 4 + k) as u8; 16 << 10];
                db.db().put(format!("k{:06}", f * 4 + k), v).expect("put");
            }
            db.flush().expect("flush");
        }
        dbs.push(Arc::new(db));
    }
    let checkpoints: Arc<dyn CheckpointStore> = Arc::new(BlobCheckpointStore::new(
        Arc::clone(&store),
        JobScope::new("idle", "1").expect("scope"),
    ));
    let clock = Arc::new(SystemClock);
    let (mgr, last) = TaskCommitManager::start(
        ctx.clone(),
        Arc::clone(&checkpoints),
        clock.clone(),
        2,
        false,
    )
    .await
    .expect("start");
    let backup = Arc::new(
        BlobBackupManager::new(
            Arc::clone(&store),
            ctx.clone(),
            &specs,
            clock.clone(),
            BackupSettings::default(),
        )
        .expect("backup manager"),
    );
    backup.init(last.as_ref()).await.expect("init");
    let mgr = mgr
        .with_stores(
            dbs.iter()
                .map(|d| Arc::clone(d) as Arc<dyn StoreEngine>)
                .collect(),
        )
        .with_backends(
            vec![Backend {
                name: FACTORY_NAME.into(),
                manager: Arc::clone(&backup) as Arc<dyn TaskBackupManager>,
            }],
            last,
        );
    let offsets = |i: usize| BTreeMap::from([(Ssp::new("bench", "in", 0), i.to_string())]);
    // The first commit uploads everything; the second proves the rest carries forward.
    let first = mgr.commit(offsets(0)).await.expect("first commit");
    let second = mgr.commit(offsets(1)).await.expect("second commit");
    let markers = |c: &blobsnap::checkpoint::CheckpointV2| c.state_checkpoint_markers.clone();
    assert_eq!(
        markers(&first.checkpoint),
        markers(&second.checkpoint),
        "nothing was written: every marker carried forward"
    );
    let files = std::fs::read_dir(&specs[0].dir).expect("dir").count();
    println!(
        "idle: {stores_n} stores × {ssts} SSTs ({files} files in a store dir), local store, {rounds} rounds, CPU of the whole process (median)"
    );

    let db = &dbs[0];
    let flush = cpu_ms(rounds, |_| async {
        db.flush().expect("flush");
    })
    .await;
    let scratch = tmp.path().join("scratch");
    let checkpoint = cpu_ms(rounds, |i| {
        let dir = scratch.join(i.to_string());
        async move {
            db.checkpoint_to(&dir).expect("checkpoint");
        }
    })
    .await;
    let _ = std::fs::remove_dir_all(&scratch);

    // The backend's upload of one unchanged store's fresh checkpoint dir (a manager of that
    // store alone, based on the last commit).
    let backup = Arc::new(
        BlobBackupManager::new(
            Arc::clone(&store),
            ctx.clone(),
            &specs[..1],
            clock.clone(),
            BackupSettings::default(),
        )
        .expect("backup manager"),
    );
    backup
        .init(Some(&blobsnap::checkpoint::Checkpoint::V2(
            second.checkpoint.clone(),
        )))
        .await
        .expect("init");
    // Timed around the upload alone (each round first makes a fresh checkpoint dir).
    let mut ids = CheckpointIdGen::for_epoch(Some(second.checkpoint.id), 1 << 20);
    let mut upload_ms = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let id = ids
            .next(blobsnap::backend::Clock::now_millis(&SystemClock))
            .expect("id");
        let dir = specs[0].checkpoint_dir(id);
        db.checkpoint_to(&dir).expect("checkpoint");
        let dirs = BTreeMap::from([(specs[0].name.clone(), dir.clone())]);
        let c0 = cpu_secs();
        let m = backup
            .upload(id, &StoreMarkers::new(), &dirs)
            .await
            .expect("upload");
        upload_ms.push((cpu_secs() - c0) * 1e3);
        assert!(m.contains_key(&specs[0].name));
        let _ = std::fs::remove_dir_all(&dir);
    }
    let upload = median(upload_ms);

    let carried = &second.checkpoint.state_checkpoint_markers;
    let task_commit = cpu_ms(rounds, |i| {
        let mgr = &mgr;
        async move {
            let r = mgr.commit(offsets(i + 2)).await.expect("commit");
            assert_eq!(&r.checkpoint.state_checkpoint_markers, carried);
        }
    })
    .await;
    println!("  flush (empty memtable):           {flush:.3} ms");
    println!("  RocksDB checkpoint:               {checkpoint:.3} ms");
    println!("  upload of the unchanged dir:      {upload:.3} ms");
    println!(
        "  a whole task commit ({stores_n} stores): {task_commit:.3} ms = {:.3} ms per store",
        task_commit / stores_n as f64
    );
}
