//! Pre-upload (issue 33, DESIGN §7 step 2): table and blob files uploaded as RocksDB finishes
//! them; a commit names those blobs instead of sending the files; waste (files compacted away
//! before any commit named them) is counted and deleted; the restore gives back the bytes.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;

use blobsnap::backend::{
    Clock, StoreEngine, StoreSpec, SystemClock, TaskBackupManager as _, TaskRestoreManager as _,
};
use blobsnap::blob::backup::{BackupSettings, BlobBackupManager};
use blobsnap::blob::restore::{BlobRestoreManager, RestoreSettings};
use blobsnap::blob::FACTORY_NAME;
use blobsnap::blobstore::{list_all, BlobStore};
use blobsnap::checkpoint::{BlobCheckpointStore, CheckpointStore, Ssp};
use blobsnap::commit::{Backend, TaskCommitManager};
use blobsnap::layout::JobScope;
use blobsnap::local::rocks::RocksStore;

store_suites!([a_commit_names_pre_uploaded_files_and_waste_is_counted_and_deleted]);

/// Wait (for the worker's events, up to a minute) until `cond` holds of the store's totals.
async fn until(
    backup: &BlobBackupManager,
    what: &str,
    cond: impl Fn(&blobsnap::blob::preupload::PreUploadTotals) -> bool,
) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let t = backup
            .pre_upload_totals("counts")
            .expect("pre-upload is on");
        if cond(&t) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}: {t:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// The SST files of `dir` with their bytes.
fn ssts(dir: &std::path::Path) -> BTreeMap<String, Vec<u8>> {
    support::files_but_logs(dir)
        .into_iter()
        .filter(|(n, _)| n.ends_with(".sst"))
        .collect()
}

fn sha_hex(bytes: &[u8]) -> String {
    blobsnap::digest::Sha256::of(bytes).to_hex()
}

mod cases {
    use super::*;

    /// Flushes are pre-uploaded and the next commit sends no SST; a file the commit's own
    /// flush makes is sent once (by the commit or by the pre-upload it waits for); a file a
    /// compaction deletes before any commit names it is waste: counted, and its blob deleted
    /// with a later commit's batch; restore gives back every byte and the offsets.
    pub async fn a_commit_names_pre_uploaded_files_and_waste_is_counted_and_deleted(
        h: &support::Harness,
    ) {
        let ctx = blobsnap::backend::TaskContext {
            job_name: h.scope.as_str().trim_end_matches('/').to_string(),
            job_id: "1".into(),
            task_name: "Partition 0".into(),
        };
        let store: Arc<dyn BlobStore> = Arc::clone(&h.store);
        let job = JobScope::new(&ctx.job_name, "1").unwrap();
        let checkpoints: Arc<dyn CheckpointStore> =
            Arc::new(BlobCheckpointStore::new(Arc::clone(&store), job.clone()));
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
            2,
            unsafe_ok,
        )
        .await
        .unwrap();
        let mut opts = rocksdb::Options::default();
        opts.create_if_missing(true);
        opts.set_disable_auto_compactions(true);
        let db = Arc::new(RocksStore::open_with("counts", &spec.dir, &opts).unwrap());
        let backup = Arc::new(
            BlobBackupManager::new(
                Arc::clone(&store),
                ctx.clone(),
                std::slice::from_ref(&spec),
                Arc::clone(&clock),
                BackupSettings {
                    writer_lease: false,
                    pre_upload: true,
                    ..Default::default()
                },
            )
            .unwrap(),
        );
        backup.init(last.as_ref()).await.unwrap();
        let mgr = mgr
            .with_stores(vec![Arc::clone(&db) as Arc<dyn StoreEngine>])
            .with_backends(
                vec![Backend {
                    name: FACTORY_NAME.into(),
                    manager: Arc::clone(&backup) as _,
                }],
                last,
            );
        let scope = job.store(&ctx.task_name, "counts").unwrap();
        let commit = |n: u32| {
            mgr.commit(BTreeMap::from([(
                Ssp::new("files", "lines", 0),
                n.to_string(),
            )]))
        };

        // 1. A flush between commits is pre-uploaded; the commit sends no SST.
        support::rocks::write_keys_of(&db, 0, 400, 1, 256);
        db.db().flush().unwrap();
        let files = |b: &BlobBackupManager| b.pre_upload_totals("counts").unwrap().files;
        until(&backup, "the flush's pre-upload", |t| t.files == 1).await;
        let first_sst = ssts(&spec.dir);
        assert_eq!(first_sst.len(), 1, "{:?}", first_sst.keys());
        let r1 = commit(400).await.unwrap();
        let s1 = backup.last_upload_stats()["counts"];
        assert_eq!(
            (s1.files_pre_uploaded, s1.blobs_uploaded),
            (1, 0),
            "the SST was pre-uploaded, nothing else is a blob: {s1:?}"
        );
        let idx1 = support::index_of_store(
            store.as_ref(),
            &ctx,
            "counts",
            r1.checkpoint
                .marker(FACTORY_NAME, "counts")
                .expect("marker"),
        )
        .await;
        let (name, bytes) = first_sst.iter().next().unwrap();
        let entry = idx1
            .present_files()
            .into_iter()
            .find(|(_, f)| &f.file_name == name)
            .map(|(_, f)| f.clone())
            .expect("the SST is in the index");
        let blob = &entry.blobs[0].blob_id;
        assert!(
            blob.ends_with(&sha_hex(bytes)) && !blob.contains(&r1.checkpoint.id.to_string()),
            "named under the pre-upload's own id, not the commit's: {blob}"
        );
        assert_eq!(
            idx1.blob_origin(&entry.blobs[0]),
            blobsnap::index::BlobOrigin::PreUploaded,
            "what `blobsnap inspect` shows"
        );

        // 2. The commit's own flush makes an SST while it runs: sent exactly once.
        support::rocks::write_keys_of(&db, 400, 400, 2, 256);
        let r2 = commit(800).await.unwrap();
        let second: Vec<(String, Vec<u8>)> = ssts(&spec.dir)
            .into_iter()
            .filter(|(n, _)| !first_sst.contains_key(n))
            .collect();
        assert_eq!(second.len(), 1);
        let objects = list_all(store.as_ref(), scope.scope()).await.unwrap();
        let copies = |sha: &str| {
            objects
                .iter()
                .filter(|o| o.key.as_str().ends_with(sha))
                .count()
        };
        assert_eq!(copies(&sha_hex(&second[0].1)), 1, "sent once");
        assert_eq!(copies(&sha_hex(bytes)), 1, "sent once");

        // 3. A flush pre-uploaded, then compacted away with the others before any commit:
        //    waste, deleted by a later commit's batch once no commit can name it.
        // (Keys that overlap both earlier files: the compaction rewrites, not moves, them.)
        support::rocks::write_keys_of(&db, 200, 1000, 3, 256);
        let before = files(&backup);
        db.db().flush().unwrap();
        until(&backup, "the third flush's pre-upload", |t| {
            t.files == before + 1
        })
        .await;
        let doomed: Vec<(String, Vec<u8>)> = ssts(&spec.dir)
            .into_iter()
            .filter(|(n, _)| !first_sst.contains_key(n) && *n != second[0].0)
            .collect();
        assert_eq!(doomed.len(), 1);
        db.db().compact_range::<&[u8], &[u8]>(None, None);
        until(&backup, "the compaction's pre-upload", |t| {
            t.files == before + 2
        })
        .await;
        let r3 = commit(1200).await.unwrap();
        let s3 = backup.last_upload_stats()["counts"];
        assert_eq!((s3.files_pre_uploaded, s3.blobs_uploaded), (1, 0), "{s3:?}");
        support::rocks::write_keys_of(&db, 1200, 10, 4, 256);
        let r4 = commit(1210).await.unwrap();
        mgr.finish().await.unwrap();
        let t = backup.pre_upload_totals("counts").unwrap();
        assert_eq!(
            (t.files_wasted, t.bytes_wasted),
            (1, doomed[0].1.len() as u64),
            "{t:?}"
        );
        let objects = list_all(store.as_ref(), scope.scope()).await.unwrap();
        assert_eq!(
            objects
                .iter()
                .filter(|o| o.key.as_str().ends_with(&sha_hex(&doomed[0].1)))
                .count(),
            0,
            "the wasted pre-upload is deleted"
        );
        assert!(r3.checkpoint.id < r4.checkpoint.id && r1.seq < r2.seq);

        // 4. Restore the last checkpoint: the database's bytes and the offsets come back.
        let live = ssts(&spec.dir);
        let latest = checkpoints
            .latest(&ctx.task_name)
            .await
            .unwrap()
            .expect("a checkpoint");
        let v2 = latest.checkpoint.as_v2().expect("v2").clone();
        assert_eq!(
            v2.input_offsets
                .get(&Ssp::new("files", "lines", 0))
                .map(String::as_str),
            Some("1210")
        );
        drop(mgr);
        drop(backup);
        let restored = StoreSpec {
            name: "counts".into(),
            dir: tmp.path().join("restored"),
        };
        let r = BlobRestoreManager::new(
            Arc::clone(&store),
            ctx.clone(),
            std::slice::from_ref(&restored),
            RestoreSettings::default(),
        )
        .unwrap();
        r.init(Some(&latest.checkpoint)).await.unwrap();
        r.restore().await.unwrap();
        let back = ssts(&restored.dir);
        for (n, b) in &back {
            if let Some(l) = live.get(n) {
                assert_eq!(l, b, "{n} restored byte for byte");
            }
        }
        assert!(!back.is_empty());
        let db2 = RocksStore::open("counts", &restored.dir).unwrap();
        for i in [0u32, 399, 800, 1209] {
            assert!(
                db2.db().get(format!("key{i:08}")).unwrap().is_some(),
                "key {i} restored"
            );
        }
    }
}
