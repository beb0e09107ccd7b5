//! Crash safety of restore: a real `blobsnap restore` child process is killed with SIGKILL at
//! each named point (`BLOBSNAP_CRASH_AT`), then the store dir must hold either the old state
//! or the complete new one — never a mix — and a rerun must complete, fetching at most what
//! was still missing.

use crate::support;
use support::rocks::write_keys;

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::sync::Arc;

use blobsnap::backend::{
    StoreEngine, StoreSpec, SystemClock, TaskBackupManager, TaskContext, TaskRestoreManager,
};
use blobsnap::blob::backup::{BackupSettings, BlobBackupManager};
use blobsnap::blob::restore::{staging_dir, BlobRestoreManager, RestoreSettings, RESTORED_MARKER};
use blobsnap::blob::FACTORY_NAME;
use blobsnap::checkpoint::{Checkpoint, CheckpointIdGen, CheckpointV2};
use blobsnap::digest::Sha256;
use blobsnap::index::SnapshotIndex;
use blobsnap::local::rocks::RocksStore;

const POINTS: &[&str] = &[
    "restore.after-plan",
    "restore.mid-download",
    "restore.before-marker",
    "restore.after-marker",
    "restore.after-exchange",
];

/// Relative path → SHA-256 of every file under `dir`, without the RESTORED marker.
fn tree(dir: &Path) -> BTreeMap<String, Sha256> {
    fn walk(d: &Path, rel: &str, out: &mut BTreeMap<String, Sha256>) {
        for e in std::fs::read_dir(d).unwrap().flatten() {
            let name = e.file_name().into_string().unwrap();
            if e.path().is_dir() {
                walk(&e.path(), &format!("{rel}{name}/"), out);
            } else if name != RESTORED_MARKER {
                out.insert(
                    format!("{rel}{name}"),
                    Sha256::of(&std::fs::read(e.path()).unwrap()),
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, "", &mut out);
    out
}

fn index_tree(idx: &SnapshotIndex) -> BTreeMap<String, Sha256> {
    idx.present_files()
        .into_iter()
        .map(|(p, f)| (p, f.sha256.unwrap()))
        .collect()
}

/// `blobsnap <store args> --json restore MARKER --job J --task T --store counts --to DST`.
fn restore_cmd(
    bin: &str,
    child_args: &[String],
    child_env: &[(String, String)],
    task: &TaskContext,
    marker: &str,
    dst: &Path,
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args(child_args)
        .args([
            "--json",
            "restore",
            marker,
            "--job",
            &task.job_name,
            "--task",
            &task.task_name,
            "--store",
            "counts",
            "--to",
        ])
        .arg(dst)
        // The CLI's hash cache beside the target, never in the user's ~/.cache.
        .env("XDG_CACHE_HOME", dst.with_extension("cache"))
        .envs(child_env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    cmd
}

async fn run_matrix(
    h: support::Harness,
    child_args: Vec<String>,
    child_env: Vec<(String, String)>,
) {
    let tmp = tempfile::tempdir().unwrap();
    let task = TaskContext {
        job_name: h.scope.as_str().trim_end_matches('/').to_string(),
        job_id: "1".into(),
        task_name: "Partition 0".into(),
    };
    let src = StoreSpec {
        name: "counts".into(),
        dir: tmp.path().join("src"),
    };
    let db = RocksStore::open("counts", &src.dir).unwrap();
    let mgr = BlobBackupManager::new(
        Arc::clone(&h.store),
        task.clone(),
        std::slice::from_ref(&src),
        Arc::new(SystemClock),
        BackupSettings::default(),
    )
    .unwrap();
    mgr.init(None).await.unwrap();
    let mut ids = CheckpointIdGen::new();
    let mut checkpoints = Vec::new();
    for (from, n, seed) in [(0, 1500, 1), (1500, 1500, 2)] {
        write_keys(&db, from, n, seed);
        // Several SSTs per snapshot, so that a crash can fall between two downloads.
        db.flush().unwrap();
        write_keys(&db, from + 100_000, 300, seed + 10);
        let id = ids
            .next(blobsnap::backend::Clock::now_millis(&SystemClock))
            .unwrap();
        let m = support::rocks::commit_once(&mgr, &db, id).await;
        checkpoints.push(Checkpoint::V2(CheckpointV2 {
            id,
            input_offsets: Default::default(),
            state_checkpoint_markers: BTreeMap::from([(FACTORY_NAME.to_string(), m)]),
        }));
    }
    drop(db);
    let marker = |cp: &Checkpoint| {
        cp.as_v2()
            .unwrap()
            .marker(FACTORY_NAME, "counts")
            .unwrap()
            .to_string()
    };
    let mut indexes = Vec::new();
    for cp in &checkpoints {
        indexes.push(support::index_of_store(h.store.as_ref(), &task, "counts", &marker(cp)).await);
    }
    let (old, new) = (index_tree(&indexes[0]), index_tree(&indexes[1]));
    let old_shas: std::collections::HashSet<Sha256> = old.values().copied().collect();
    let missing: u64 = indexes[1]
        .present_files()
        .iter()
        .filter(|(_, f)| !old_shas.contains(&f.sha256.unwrap()))
        .map(|(_, f)| f.file_metadata.size)
        .sum();
    assert!(missing > 0);

    let bin = env!("CARGO_BIN_EXE_blobsnap");
    for point in POINTS {
        for round in 0..2 {
            // Start from the old snapshot, restored by the library.
            let dst = StoreSpec {
                name: "counts".into(),
                dir: tmp
                    .path()
                    .join(format!("dst-{}-{round}", point.replace('.', "-"))),
            };
            let r = BlobRestoreManager::new(
                Arc::clone(&h.store),
                task.clone(),
                std::slice::from_ref(&dst),
                RestoreSettings::default(),
            )
            .unwrap();
            r.init(Some(&checkpoints[0])).await.unwrap();
            r.restore().await.unwrap();
            assert_eq!(tree(&dst.dir), old);

            let mut cmd = restore_cmd(
                bin,
                &child_args,
                &child_env,
                &task,
                &marker(&checkpoints[1]),
                &dst.dir,
            );
            cmd.env("BLOBSNAP_CRASH_AT", point);
            let out = cmd.output().await.unwrap();
            assert_eq!(
                out.status.signal(),
                Some(9),
                "{point}: child was not killed: {out:?}"
            );

            let after = tree(&dst.dir);
            assert!(
                after == old || after == new,
                "{point}: the store dir is a mix of old and new"
            );
            if *point == "restore.after-exchange" {
                assert_eq!(after, new, "{point}: the exchange happened");
                symlinks_left_in_staging_are_never_followed(
                    bin,
                    &child_args,
                    &child_env,
                    &task,
                    &marker(&checkpoints[0]),
                    &dst.dir,
                    &old,
                    &new,
                    &tmp.path().join(format!("outside-{round}")),
                )
                .await;
            }
            if [
                "restore.after-plan",
                "restore.mid-download",
                "restore.before-marker",
            ]
            .contains(point)
            {
                assert_eq!(after, old, "{point}: the old state is still in place");
            }

            if *point == "restore.after-marker" {
                // As a filesystem without RENAME_EXCHANGE leaves it (an intent to swap, the
                // complete staging tree), with an old tree left beside the store dir by an
                // earlier swap: the rerun must roll forward, not fail on the leftover.
                let name = dst.dir.file_name().unwrap().to_string_lossy().to_string();
                std::fs::write(
                    dst.dir.with_file_name(format!("{name}.blobsnap-intent")),
                    b"swap",
                )
                .unwrap();
                let old_dir = dst.dir.with_file_name(format!("{name}.blobsnap-old"));
                std::fs::create_dir_all(old_dir.join("sub")).unwrap();
                std::fs::write(old_dir.join("sub/000001.sst"), b"an old tree").unwrap();
            }
            // The rerun completes and fetches at most what was still missing.
            let out = restore_cmd(
                bin,
                &child_args,
                &child_env,
                &task,
                &marker(&checkpoints[1]),
                &dst.dir,
            )
            .output()
            .await
            .unwrap();
            assert!(
                out.status.success(),
                "{point}: rerun failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let fetched = report["bytes-fetched"].as_u64().unwrap();
            assert!(
                fetched <= missing,
                "{point}: rerun fetched {fetched} > {missing} missing"
            );
            if *point == "restore.mid-download" || *point == "restore.before-marker" {
                assert!(
                    fetched < missing,
                    "{point}: the rerun reused what staging held ({fetched} of {missing})"
                );
            }
            assert_eq!(tree(&dst.dir), new, "{point}");
            assert!(
                !staging_dir(&dst.dir).unwrap().exists(),
                "{point}: staging left behind"
            );
            let name = dst.dir.file_name().unwrap().to_string_lossy().to_string();
            for leftover in [".blobsnap-intent", ".blobsnap-old"] {
                assert!(
                    !dst.dir.with_file_name(format!("{name}{leftover}")).exists(),
                    "{point}: {leftover} left behind"
                );
            }
        }
    }
}

/// A restore killed after the exchange leaves the old tree in staging, which may hold
/// anything: symlinks planted there (a directory link `sub -> outside` and a link named like
/// a file the next restore reuses) must be removed, never followed, by the next restore.
#[allow(clippy::too_many_arguments)]
async fn symlinks_left_in_staging_are_never_followed(
    bin: &str,
    child_args: &[String],
    child_env: &[(String, String)],
    task: &TaskContext,
    old_marker: &str,
    dst: &Path,
    old: &BTreeMap<String, Sha256>,
    new: &BTreeMap<String, Sha256>,
    outside: &Path,
) {
    let staging = staging_dir(dst).unwrap();
    assert!(staging.is_dir(), "the old tree is left in staging");
    std::fs::create_dir_all(outside.join("subdir")).unwrap();
    std::fs::write(outside.join("victim"), b"not yours").unwrap();
    std::fs::write(outside.join("subdir/file"), b"not yours either").unwrap();
    let before = tree(outside);
    // A file of both snapshots: the next restore reuses it from the store dir into staging.
    let shared = old
        .keys()
        .find(|n| n.ends_with(".sst") && new.get(*n) == old.get(*n))
        .expect("an SST in both snapshots")
        .clone();
    let _ = std::fs::remove_file(staging.join(&shared));
    std::os::unix::fs::symlink(outside.join("victim"), staging.join(&shared)).unwrap();
    std::os::unix::fs::symlink(outside, staging.join("sub")).unwrap();
    std::os::unix::fs::symlink(outside.join("subdir"), staging.join("subdir")).unwrap();
    let out = restore_cmd(bin, child_args, child_env, task, old_marker, dst)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "restore over a staging dir with symlinks: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        tree(outside),
        before,
        "the restore wrote outside its directory"
    );
    assert_eq!(&tree(dst), old, "the restore of the old snapshot");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_restore_at_every_point_local() {
    let h = support::local().await;
    let root = match &h.kind {
        support::Kind::Local(l) => l.root().to_path_buf(),
        support::Kind::S3(_) => unreachable!(),
    };
    run_matrix(
        h,
        vec!["--local".into(), root.display().to_string()],
        vec![],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_restore_at_every_point_s3s() {
    let h = support::s3s().await;
    let (endpoint, bucket) = match &h.kind {
        support::Kind::S3(s) => (
            s.config().endpoint.clone().unwrap(),
            s.config().bucket.clone(),
        ),
        support::Kind::Local(_) => unreachable!(),
    };
    let args = vec![
        "--bucket".into(),
        bucket,
        "--s3-endpoint".into(),
        endpoint,
        "--s3-region".into(),
        "us-east-1".into(),
        "--s3-path-style".into(),
    ];
    let env = vec![
        (
            "AWS_ACCESS_KEY_ID".to_string(),
            support::S3S_ACCESS_KEY.to_string(),
        ),
        (
            "AWS_SECRET_ACCESS_KEY".to_string(),
            support::S3S_SECRET_KEY.to_string(),
        ),
    ];
    run_matrix(h, args, env).await;
}
