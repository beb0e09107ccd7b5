//! Forks at the library level (the end-to-end cases are `lifecycle::forks_local` and
//! `lifecycle::external::forks`): what a fork costs, and that a fork task's pin is held
//! exactly while anything of the task — the backend's window, the retained history, the fork
//! job's savepoints — names a snapshot that borrows through it, then released.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use blobsnap::backend::{
    Clock, StoreMarkers, StoreSpec, SystemClock, TaskBackupManager, TaskContext,
};
use blobsnap::blob::backup::{BackupSettings, BlobBackupManager};
use blobsnap::blob::history::CheckpointRef;
use blobsnap::blob::{fork, savepoint, FACTORY_NAME};
use blobsnap::blobstore::counting::CountingStore;
use blobsnap::blobstore::BlobStore;
use blobsnap::checkpoint::{
    BlobCheckpointStore, Checkpoint, CheckpointIdGen, CheckpointStore, CheckpointV2,
};
use blobsnap::layout::JobScope;

use crate::support;
use blobsnap::ErrorKind;

const TASK: &str = "Partition 0";

fn files(dir: &Path, files: &[(&str, u8)]) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    for (name, byte) in files {
        std::fs::write(dir.join(name), vec![*byte; 8192]).unwrap();
    }
    dir.to_path_buf()
}

fn manager(store: &Arc<dyn BlobStore>, job_id: &str, dir: &Path) -> BlobBackupManager {
    BlobBackupManager::new(
        Arc::clone(store),
        TaskContext {
            job_name: "wordcount".into(),
            job_id: job_id.into(),
            task_name: TASK.into(),
        },
        &[StoreSpec {
            name: "counts".into(),
            dir: dir.to_path_buf(),
        }],
        Arc::new(SystemClock),
        BackupSettings {
            writer_lease: false,
            retention: 1,
            ..Default::default()
        },
    )
    .unwrap()
}

fn v2(id: blobsnap::checkpoint::CheckpointId, m: &StoreMarkers) -> Checkpoint {
    Checkpoint::V2(CheckpointV2 {
        id,
        input_offsets: BTreeMap::new(),
        state_checkpoint_markers: BTreeMap::from([(FACTORY_NAME.to_string(), m.clone())]),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_pin_is_held_while_anything_borrows_through_it_then_released() {
    let tmp = tempfile::tempdir().unwrap();
    let local: Arc<dyn BlobStore> =
        Arc::new(blobsnap::blobstore::local::LocalStore::new(tmp.path().join("store")).unwrap());
    let counting = CountingStore::new(Arc::clone(&local));
    let counters = counting.counters();
    let store: Arc<dyn BlobStore> = Arc::new(counting);
    let mut ids = CheckpointIdGen::new();
    let clock = SystemClock;
    let dirs = |d: std::path::PathBuf| BTreeMap::from([("counts".to_string(), d)]);

    // The source: one snapshot of two SSTs, committed, saved as `base`.
    let src = manager(&store, "1", &tmp.path().join("src"));
    src.init(None).await.unwrap();
    let id1 = ids.next(clock.now_millis()).unwrap();
    let d = files(
        &tmp.path().join("cp1"),
        &[("000001.sst", 1), ("000002.sst", 2)],
    );
    let m1 = src
        .upload(id1, &StoreMarkers::new(), &dirs(d))
        .await
        .unwrap();
    src.cleanup(id1, &m1).await.unwrap();
    let src_job = JobScope::new("wordcount", "1").unwrap();
    BlobCheckpointStore::new(Arc::clone(&store), src_job.clone())
        .write(TASK, 1, "w", &v2(id1, &m1))
        .await
        .unwrap();
    savepoint::create(&store, "wordcount", "1", "base", &CheckpointRef::Latest)
        .await
        .unwrap();

    // The fork: at most five requests for its one store, no data byte.
    let before = counters.snapshot();
    let forked = fork::fork_task(
        &store,
        &"wordcount/1/base".parse().unwrap(),
        "wordcount",
        "2",
        TASK,
        Duration::from_secs(3600),
    )
    .await
    .unwrap();
    let cost = counters.snapshot().since(&before);
    assert!(forked.requests <= 5, "{forked:?}");
    let calls = cost.put.calls + cost.get.calls + cost.head.calls + cost.list.calls;
    assert_eq!(calls, forked.requests, "{cost:?}");
    assert_eq!(cost.put.calls, 2, "a pin and an index: {cost:?}");
    assert!(cost.put.bytes < 8192, "no data byte written: {cost:?}");
    assert_eq!(cost.delete.calls, 0, "{cost:?}");
    assert_eq!((forked.files, forked.bytes), (2, 2 * 8192));
    assert_eq!(forked.pins.len(), 1);
    let pin = forked.pins.iter().next().unwrap().key().unwrap();
    let fork_job = JobScope::new("wordcount", "2").unwrap();
    let fork_cps = BlobCheckpointStore::new(Arc::clone(&store), fork_job.clone());
    fork_cps
        .write(TASK, 1, "w", &forked.checkpoint)
        .await
        .unwrap();

    let fm = manager(&store, "2", &tmp.path().join("fork"));
    fm.init(Some(&forked.checkpoint)).await.unwrap();
    let pinned = || async { local.head(&pin).await.is_ok() };
    let rm_base = || savepoint::remove(store.as_ref(), &src_job, "base");

    // #2 keeps one borrowed SST: the window borrows, the pin stays.
    let id2 = ids.next(clock.now_millis()).unwrap();
    let d = files(
        &tmp.path().join("cp2"),
        &[("000002.sst", 2), ("000003.sst", 3)],
    );
    let m2 = fm
        .upload(id2, &StoreMarkers::new(), &dirs(d))
        .await
        .unwrap();
    fork_cps.write(TASK, 2, "w", &v2(id2, &m2)).await.unwrap();
    // A savepoint of the fork at #2: it borrows too.
    savepoint::create(&store, "wordcount", "2", "f", &CheckpointRef::Seq(2))
        .await
        .unwrap();
    fm.cleanup(id2, &m2).await.unwrap();
    assert!(pinned().await);
    let e = rm_base().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
    assert!(
        e.to_string().contains("wordcount/2 task Partition 0"),
        "{e}"
    );

    // #3 borrows nothing; #1 and #2 are still in the history: the pin stays.
    let id3 = ids.next(clock.now_millis()).unwrap();
    let d = files(&tmp.path().join("cp3"), &[("000004.sst", 4)]);
    let m3 = fm
        .upload(id3, &StoreMarkers::new(), &dirs(d))
        .await
        .unwrap();
    fork_cps.write(TASK, 3, "w", &v2(id3, &m3)).await.unwrap();
    fm.cleanup(id3, &m3).await.unwrap();
    assert!(pinned().await, "older retained checkpoints still borrow");
    // The fork's own cleanup deleted nothing of the source's: the saved snapshot is whole.
    savepoint::check_present(
        store.as_ref(),
        &savepoint::read(store.as_ref(), &src_job, "base")
            .await
            .unwrap(),
    )
    .await
    .unwrap();

    // With the history trimmed to #3, the fork's savepoint of #2 alone keeps the pin.
    fork_cps.delete_seqs(TASK, &[1, 2]).await.unwrap();
    fm.cleanup(id3, &m3).await.unwrap();
    assert!(pinned().await, "the fork's savepoint still borrows");
    // `savepoint unpin` keeps a pin the fork's savepoint borrows through (a dry run and a real one).
    for dry_run in [true, false] {
        let done = fork::unpin(
            Arc::clone(&store),
            &src_job,
            "base",
            "wordcount",
            "2",
            dry_run,
        )
        .await
        .unwrap();
        assert!(done.removed.is_empty(), "{done:?}");
        assert_eq!(done.kept.len(), 1, "{done:?}");
        assert!(pinned().await);
    }

    // Nothing borrows: released, and the source may remove its savepoint.
    savepoint::remove(store.as_ref(), &fork_job, "f")
        .await
        .unwrap();
    fm.cleanup(id3, &m3).await.unwrap();
    assert!(!pinned().await, "released once nothing borrows");
    rm_base().await.unwrap();
}

/// A fork's pin beside no savepoint record (a `savepoint rm` racing the fork, or interrupted
/// between its delete and its check of the pins): the source's sweep and its cleanup's batch
/// delete fail closed — what the record kept is unknown — naming the fork and what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pin_without_its_savepoint_stops_the_collectors() {
    use blobsnap::blob::gc::{plan_sweep, SweepSettings};
    use blobsnap::blobstore::{DeferredDeletes, PutBody, PutOptions};
    let tmp = tempfile::tempdir().unwrap();
    let store: Arc<dyn BlobStore> =
        Arc::new(blobsnap::blobstore::local::LocalStore::new(tmp.path().join("store")).unwrap());
    let src = manager(&store, "1", &tmp.path().join("src"));
    src.init(None).await.unwrap();
    let id1 = CheckpointIdGen::new()
        .next(SystemClock.now_millis())
        .unwrap();
    let d = files(&tmp.path().join("cp1"), &[("000001.sst", 1)]);
    let m1 = src
        .upload(
            id1,
            &StoreMarkers::new(),
            &BTreeMap::from([("counts".to_string(), d)]),
        )
        .await
        .unwrap();
    src.cleanup(id1, &m1).await.unwrap();
    let src_job = JobScope::new("wordcount", "1").unwrap();
    BlobCheckpointStore::new(Arc::clone(&store), src_job.clone())
        .write(TASK, 1, "w", &v2(id1, &m1))
        .await
        .unwrap();
    let pin = src_job
        .fork_pin_key("gone", "wordcount", "2", TASK)
        .unwrap();
    store
        .put(&pin, PutBody::Bytes("{}".into()), PutOptions::default())
        .await
        .unwrap();
    let e = plan_sweep(
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
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
    assert!(
        e.to_string().contains("wordcount/2 task Partition 0")
            && e.to_string().contains("\"gone\""),
        "{e}"
    );
    // The cleanup's batch delete: nothing deleted either.
    let victim = src_job
        .store(TASK, "counts")
        .unwrap()
        .key(&m1["counts"])
        .unwrap();
    let e = DeferredDeletes {
        store: Arc::clone(&store),
        keys: vec![victim.clone()],
        pins: Some(Arc::new(
            savepoint::Pins::new(Arc::clone(&store), "wordcount", "1").unwrap(),
        )),
    }
    .delete_with(&[])
    .await
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
    store.head(&victim).await.unwrap();
    // `check` names it among the job's problems.
    let report = blobsnap::blob::check::check_job(
        &store,
        "wordcount",
        "1",
        &blobsnap::blob::check::CheckOptions {
            read_data: false,
            subset_pct: 100.0,
        },
    )
    .await
    .unwrap();
    assert!(
        report.problems.iter().any(|p| p
            .message
            .contains("pins savepoint \"gone\", which has no record")),
        "{report:?}"
    );
    // The way out it names: `savepoint unpin`. The fork (wordcount/2) retains nothing that
    // borrows through the pin: a dry run names it and deletes nothing; then it goes, and the
    // sweep runs again. A fork that holds no pin is NotFound.
    let settings = SweepSettings {
        job_name: "wordcount".into(),
        job_id: "1".into(),
        task: None,
        store: None,
        grace: std::time::Duration::ZERO,
    };
    let sweep = || plan_sweep(&store, &settings);
    let e = sweep().await.unwrap_err();
    assert!(
        e.to_string().contains("savepoint unpin"),
        "names the way out: {e}"
    );
    // A running fork (a live writer lease) is refused: it releases its own pins.
    let fork_scope = JobScope::new("wordcount", "2").unwrap();
    let lease = blobsnap::blob::admin::WriterLease::new(TASK, std::time::Duration::from_secs(3600));
    lease.announce(store.as_ref(), &fork_scope).await.unwrap();
    let e = fork::unpin(Arc::clone(&store), &src_job, "gone", "wordcount", "2", true)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
    assert!(e.to_string().contains("is running"), "{e}");
    lease.retire(store.as_ref(), &fork_scope).await.unwrap();
    let done = fork::unpin(Arc::clone(&store), &src_job, "gone", "wordcount", "2", true)
        .await
        .unwrap();
    assert_eq!((done.removed.len(), done.kept.len()), (1, 0), "{done:?}");
    store.head(&pin).await.unwrap();
    let done = fork::unpin(
        Arc::clone(&store),
        &src_job,
        "gone",
        "wordcount",
        "2",
        false,
    )
    .await
    .unwrap();
    assert_eq!((done.removed.len(), done.kept.len()), (1, 0), "{done:?}");
    assert_eq!(
        store.head(&pin).await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    sweep().await.unwrap();
    let e = fork::unpin(
        Arc::clone(&store),
        &src_job,
        "gone",
        "wordcount",
        "2",
        false,
    )
    .await
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
}

/// A fork started again from another savepoint keeps the pins of the first in its start-from
/// record (issue 46, S4-7): overwritten, nothing would ever release them and the first source
/// savepoint could never be removed. Both pins are in the record after the second start (the
/// backend releases each once nothing the fork retains borrows through it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_start_from_keeps_the_pins_of_the_first() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let run = |args: Vec<String>| {
        let store = store.clone();
        let cache = tmp.path().join("cache");
        async move {
            let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
                .arg("--json")
                .arg("--local")
                .arg(&store)
                .args(&args)
                .env("XDG_CACHE_HOME", cache)
                .output()
                .await
                .unwrap();
            assert!(
                out.status.success(),
                "{args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    };
    let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let demo = |id: &str, dir: &str, lines: &str, extra: &[&str]| {
        let mut a = s(&[
            "demo",
            "--dir",
            tmp.path().join(dir).to_str().unwrap(),
            "--partitions",
            "1",
            "--lines",
            lines,
            "--commit-every",
            "200",
            "--job-id",
            id,
        ]);
        a.extend(s(extra));
        a
    };
    run(demo("1", "src", "600", &[])).await;
    run(s(&[
        "savepoint",
        "create",
        "--job",
        "wordcount",
        "--name",
        "a",
    ]))
    .await;
    run(demo("1", "src", "1200", &[])).await;
    run(s(&[
        "savepoint",
        "create",
        "--job",
        "wordcount",
        "--name",
        "b",
    ]))
    .await;
    run(demo(
        "2",
        "fork",
        "1200",
        &["--start-from", "savepoint:wordcount/1/a"],
    ))
    .await;
    run(demo(
        "2",
        "fork2",
        "1200",
        &["--start-from", "savepoint:wordcount/1/b"],
    ))
    .await;
    let key = JobScope::new("wordcount", "2")
        .unwrap()
        .start_from_key(TASK)
        .unwrap();
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(store.join(key.as_str())).unwrap()).unwrap();
    let pinned: Vec<&str> = record["pins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["savepoint"].as_str().unwrap())
        .collect();
    assert!(
        pinned.contains(&"a") && pinned.contains(&"b"),
        "both starts' pins are in the record: {record}"
    );
}

/// Issue 46, S4-7: a fork index left by an earlier attempt (a crash between its PUT and the
/// fork's head) is named again only while it is younger than half the fork job's grace, or
/// once a retained checkpoint of the fork names it. An older orphan may be being deleted by a
/// sweep, so the fork fails and names the sweep to run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_index_left_by_an_earlier_attempt_is_named_again_only_while_young_or_retained() {
    let tmp = tempfile::tempdir().unwrap();
    let store: Arc<dyn BlobStore> =
        Arc::new(blobsnap::blobstore::local::LocalStore::new(tmp.path().join("store")).unwrap());
    let mut ids = CheckpointIdGen::new();
    let src = manager(&store, "1", &tmp.path().join("src"));
    src.init(None).await.unwrap();
    let id1 = ids.next(SystemClock.now_millis()).unwrap();
    let d = files(&tmp.path().join("cp1"), &[("000001.sst", 1)]);
    let m1 = src
        .upload(
            id1,
            &StoreMarkers::new(),
            &BTreeMap::from([("counts".to_string(), d)]),
        )
        .await
        .unwrap();
    src.cleanup(id1, &m1).await.unwrap();
    BlobCheckpointStore::new(Arc::clone(&store), JobScope::new("wordcount", "1").unwrap())
        .write(TASK, 1, "w", &v2(id1, &m1))
        .await
        .unwrap();
    savepoint::create(&store, "wordcount", "1", "base", &CheckpointRef::Latest)
        .await
        .unwrap();
    let source: fork::ForkSource = "wordcount/1/base".parse().unwrap();
    let fork = |grace: u64| {
        fork::fork_task(
            &store,
            &source,
            "wordcount",
            "2",
            TASK,
            Duration::from_secs(grace),
        )
    };

    // The first attempt writes the index; the fork "crashes" before its head.
    let first = fork(3600).await.unwrap();
    // A retry within half the grace names the same index again.
    let again = fork(3600).await.unwrap();
    assert_eq!(again.checkpoint, first.checkpoint);
    // With a grace it has outlived, the index may be an orphan a sweep is deleting: refused.
    let e = fork(0).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("earlier attempt") && msg.contains("blobsnap gc"),
        "{msg}"
    );
    // Once the fork's history names it, it is a root: named again, whatever its age.
    BlobCheckpointStore::new(Arc::clone(&store), JobScope::new("wordcount", "2").unwrap())
        .write(TASK, 1, "w", &first.checkpoint)
        .await
        .unwrap();
    let named = fork(0).await.unwrap();
    assert_eq!(named.checkpoint, first.checkpoint);
}

/// Issue 46, S4-3: a fork's pin that a savepoint made meanwhile needs again is written back
/// only with the source's savepoint checked unchanged; had it gone while no pin stood (its
/// collectors may have acted), the release fails naming the check to run. The interleaving is
/// driven by the store's GET hook: the fork's savepoint appears just before the pin's delete,
/// and (the second time) the source's savepoint goes just after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pin_written_back_after_its_release_is_checked_against_the_source_savepoint() {
    for source_goes in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("store");
        let store: Arc<dyn BlobStore> =
            Arc::new(blobsnap::blobstore::local::LocalStore::new(&root).unwrap());
        let mut ids = CheckpointIdGen::new();
        let src = manager(&store, "1", &tmp.path().join("src"));
        src.init(None).await.unwrap();
        let id1 = ids.next(SystemClock.now_millis()).unwrap();
        let d = files(&tmp.path().join("cp1"), &[("000001.sst", 1)]);
        let m1 = src
            .upload(
                id1,
                &StoreMarkers::new(),
                &BTreeMap::from([("counts".to_string(), d)]),
            )
            .await
            .unwrap();
        src.cleanup(id1, &m1).await.unwrap();
        let src_job = JobScope::new("wordcount", "1").unwrap();
        BlobCheckpointStore::new(Arc::clone(&store), src_job.clone())
            .write(TASK, 1, "w", &v2(id1, &m1))
            .await
            .unwrap();
        savepoint::create(&store, "wordcount", "1", "base", &CheckpointRef::Latest)
            .await
            .unwrap();
        let forked = fork::fork_task(
            &store,
            &"wordcount/1/base".parse().unwrap(),
            "wordcount",
            "2",
            TASK,
            Duration::from_secs(3600),
        )
        .await
        .unwrap();
        let pin = forked.pins.iter().next().unwrap().key().unwrap();

        // The fork's savepoint `f` of its head, kept as bytes, then gone with the head: at
        // the release's decision nothing borrows through the pin.
        let fork_job = JobScope::new("wordcount", "2").unwrap();
        let fork_cps = BlobCheckpointStore::new(Arc::clone(&store), fork_job.clone());
        fork_cps
            .write(TASK, 1, "w", &forked.checkpoint)
            .await
            .unwrap();
        savepoint::create(&store, "wordcount", "2", "f", &CheckpointRef::Latest)
            .await
            .unwrap();
        let f_key = fork_job.savepoint_key("f").unwrap();
        let f_path = root.join(f_key.as_str());
        let f_bytes = std::fs::read(&f_path).unwrap();
        savepoint::remove(store.as_ref(), &fork_job, "f")
            .await
            .unwrap();
        fork_cps.delete_seqs(TASK, &[1]).await.unwrap();

        let base_key = src_job.savepoint_key("base").unwrap();
        let base_path = root.join(base_key.as_str());
        let step = Arc::new(std::sync::atomic::AtomicU8::new(0));
        let hook_step = Arc::clone(&step);
        let hooked: Arc<dyn BlobStore> = Arc::new(support::Hooked::new(
            Arc::clone(&store),
            Box::new(move |key, _| {
                use std::sync::atomic::Ordering::SeqCst;
                // The release reads the source's savepoint just before it deletes the pin:
                // a savepoint of the fork is made then (another writer of the task).
                if *key == base_key && hook_step.compare_exchange(0, 1, SeqCst, SeqCst).is_ok() {
                    std::fs::create_dir_all(f_path.parent().unwrap()).unwrap();
                    std::fs::write(&f_path, &f_bytes).unwrap();
                }
                // Its check after the delete reads that savepoint: the source's goes then.
                if *key == f_key
                    && source_goes
                    && hook_step.compare_exchange(1, 2, SeqCst, SeqCst).is_ok()
                {
                    std::fs::remove_file(&base_path).unwrap();
                }
                None
            }),
        ));
        let release = fork::Release::new(hooked, "wordcount", "2", TASK);
        let v = forked.checkpoint.as_v2().unwrap();
        let marker = v.marker(FACTORY_NAME, "counts").unwrap();
        let snap = blobsnap::blob::load_snapshot(
            store.as_ref(),
            &blobsnap::blob::Expected {
                job_name: "wordcount",
                job_id: "2",
                task_name: TASK,
                store_name: "counts",
            },
            marker,
        )
        .await
        .unwrap();
        release.note(&snap.index);
        let r = release.release_unused(std::iter::empty()).await;
        assert_eq!(
            step.load(std::sync::atomic::Ordering::SeqCst),
            1 + u8::from(source_goes)
        );
        assert!(
            store.head(&pin).await.is_ok(),
            "the pin stands again: {r:?}"
        );
        if source_goes {
            let e = r.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
            assert!(e.to_string().contains("check --read-data"), "{e}");
        } else {
            assert!(r.unwrap().is_empty(), "nothing released");
            assert!(release.holds_any());
        }
    }
}
