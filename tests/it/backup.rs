//! Backup through the SPI with real RocksDB, against the local store, the in-process s3s-fs
//! server, and (ignored here, run by scripts/test.sh) LocalStack. Requests are counted by a
//! `CountingStore` layer.

use crate::support;
use support::rocks::write_keys;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use blobsnap::backend::{
    Clock, StoreEngine, StoreMarkers, StoreSpec, SystemClock, TaskBackupManager, TaskContext,
};
use blobsnap::blob::backup::{BackupSettings, BlobBackupManager, UploadStats};
use blobsnap::blob::FACTORY_NAME;
use blobsnap::blobstore::counting::{Counters, CountingStore};
use blobsnap::blobstore::fault::{FaultConfig, FaultStore, OpRates};
use blobsnap::blobstore::{get_bytes, BlobStore};
use blobsnap::checkpoint::{Checkpoint, CheckpointId, CheckpointIdGen, CheckpointV2};
use blobsnap::digest::Sha256;
use blobsnap::index::{IndexMarker, SnapshotIndex};
use blobsnap::layout::JobScope;
use blobsnap::local::rocks::RocksStore;
use blobsnap::ErrorKind;
use support::Harness;

struct Fixture {
    task: TaskContext,
    counters: Arc<Counters>,
    store: Arc<dyn BlobStore>,
    ids: CheckpointIdGen,
    clock: Arc<dyn Clock>,
}

impl Fixture {
    fn new(h: &Harness) -> Self {
        let counting = CountingStore::new(Arc::clone(&h.store));
        let counters = counting.counters();
        Fixture {
            // The job lives inside the harness's own scope, so tests never share keys.
            task: TaskContext {
                job_name: h.scope.as_str().trim_end_matches('/').to_string(),
                job_id: "1".into(),
                task_name: "Partition 0".into(),
            },
            counters,
            store: Arc::new(counting),
            ids: CheckpointIdGen::new(),
            clock: Arc::new(SystemClock),
        }
    }

    fn manager(&self, stores: &[StoreSpec]) -> BlobBackupManager {
        // The per-commit request counts are the subject: the writer lease (one PUT and one
        // LIST per quarter of the grace) has its own test.
        self.manager_with(
            stores,
            BackupSettings {
                writer_lease: false,
                ..Default::default()
            },
        )
    }

    fn manager_with(&self, stores: &[StoreSpec], settings: BackupSettings) -> BlobBackupManager {
        BlobBackupManager::new(
            Arc::clone(&self.store),
            self.task.clone(),
            stores,
            Arc::clone(&self.clock),
            settings,
        )
        .unwrap()
    }

    fn next_id(&mut self) -> CheckpointId {
        self.ids.next(self.clock.now_millis()).unwrap()
    }

    async fn index(&self, store: &str, marker: &str) -> SnapshotIndex {
        support::index_of_store(self.store.as_ref(), &self.task, store, marker).await
    }

    /// Every present file of the index: its blob's bytes hash to the file's SHA-256.
    async fn check_blobs(&self, store: &str, index: &SnapshotIndex) {
        let scope = JobScope::new(&self.task.job_name, &self.task.job_id)
            .unwrap()
            .store(&self.task.task_name, store)
            .unwrap();
        for (path, f) in index.present_files() {
            let Some(blob) = f.blobs.first() else {
                // Inline: the bytes are in the index.
                let bytes = f
                    .inline_bytes()
                    .unwrap()
                    .expect("a file without a blob is inline");
                assert_eq!(Some(Sha256::of(&bytes)), f.sha256, "{path}");
                continue;
            };
            let key = scope.key(&blob.blob_id).unwrap();
            let bytes = get_bytes(self.store.as_ref(), &key, 1 << 30).await.unwrap();
            assert_eq!(Some(Sha256::of(&bytes)), f.sha256, "{path}");
            assert_eq!(bytes.len() as u64, f.file_metadata.size, "{path}");
            assert_eq!(crc32fast::hash(&bytes), f.checksum, "{path}");
        }
    }
}

/// What the commit manager does for one store: flush, checkpoint, upload, commit.
async fn commit_rocks(
    fx: &mut Fixture,
    mgr: &BlobBackupManager,
    db: &RocksStore,
) -> (CheckpointId, String, UploadStats) {
    let id = fx.next_id();
    let markers = support::rocks::commit_once(mgr, db, id).await;
    let stats = mgr.last_upload_stats()[db.name()];
    (id, markers[db.name()].clone(), stats)
}

/// A CheckpointV2 at `id` naming `marker` for `store` (no offsets).
fn checkpoint_of(id: CheckpointId, store: &str, marker: &str) -> Checkpoint {
    Checkpoint::V2(CheckpointV2 {
        id,
        input_offsets: Default::default(),
        state_checkpoint_markers: BTreeMap::from([(
            FACTORY_NAME.to_string(),
            BTreeMap::from([(store.to_string(), marker.to_string())]),
        )]),
    })
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

mod cases {
    use super::*;

    pub async fn second_commit_sends_only_new_content(h: &Harness) {
        let mut fx = Fixture::new(h);
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("counts");
        let spec = StoreSpec {
            name: "counts".into(),
            dir: dir.clone(),
        };
        let mgr = fx.manager(std::slice::from_ref(&spec));
        mgr.init(None).await.unwrap();

        let db = RocksStore::open("counts", &dir).unwrap();
        write_keys(&db, 0, 2000, 1);
        let before = fx.counters.snapshot();
        let (id1, m1, s1) = commit_rocks(&mut fx, &mgr, &db).await;
        let puts1 = fx.counters.snapshot().since(&before).put;
        assert_eq!(s1.diff.files_retained, 0);
        assert_eq!(s1.diff.files_added, s1.files);
        assert_eq!(
            s1.blobs_uploaded + s1.blobs_deduplicated + s1.files_inline,
            s1.diff.files_added
        );
        assert_eq!(
            puts1.calls,
            s1.blobs_uploaded + 1,
            "{}: one PUT per new blob + the index",
            h.name
        );
        // The progress a bar shows ends at exactly what was to upload (parts counted as they
        // land, the rest once each put returns; nothing twice).
        let p = mgr.progress("counts").unwrap();
        use std::sync::atomic::Ordering::Relaxed;
        assert_eq!(
            p.bytes_uploaded.load(Relaxed),
            p.bytes_to_upload.load(Relaxed),
            "{}",
            h.name
        );
        let idx1 = fx.index("counts", &m1).await;
        assert_eq!(idx1.prev_snapshot_index_blob_id, None);
        assert!(idx1
            .present_files()
            .iter()
            .any(|(p, _)| p.ends_with(".sst")));
        fx.check_blobs("counts", &idx1).await;

        // More data, and a reopen: RocksDB writes a new OPTIONS file (same content) and a new
        // (empty) WAL; the old SST stays.
        write_keys(&db, 2000, 1000, 2);
        drop(db);
        let db = RocksStore::open("counts", &dir).unwrap();
        let before = fx.counters.snapshot();
        let (id2, m2, s2) = commit_rocks(&mut fx, &mgr, &db).await;
        let puts2 = fx.counters.snapshot().since(&before).put;
        assert_eq!(puts2.calls, s2.blobs_uploaded + 1, "{}", h.name);
        assert!(s2.diff.files_retained >= 1, "{s2:?}");
        assert!(s2.bytes_uploaded < s2.bytes, "{s2:?}");
        let idx2 = fx.index("counts", &m2).await;
        assert_eq!(
            idx2.prev_snapshot_index_blob_id.as_deref(),
            Some(m1.as_str())
        );
        let old_ssts: Vec<String> = idx1
            .present_files()
            .into_iter()
            .filter(|(p, _)| p.ends_with(".sst"))
            .map(|(p, _)| p)
            .collect();
        for (path, f) in idx2.present_files() {
            let Some(blob) = f.blobs.first().map(|b| &b.blob_id) else {
                continue; // inline
            };
            if old_ssts.contains(&path) {
                assert!(
                    blob.starts_with(&format!("blobs/{id1}/")),
                    "{path} re-uploaded: {blob}"
                );
            } else if path.ends_with(".sst") {
                assert!(blob.starts_with(&format!("blobs/{id2}/")), "{path}: {blob}");
            }
        }
        // Only new content was sent: every PUT blob is content the first snapshot lacks.
        let first: std::collections::HashSet<_> = idx1
            .present_files()
            .iter()
            .filter_map(|(_, f)| f.sha256)
            .collect();
        let sent: u64 = idx2
            .present_files()
            .iter()
            .filter(|(_, f)| {
                f.blobs
                    .first()
                    .is_some_and(|b| b.blob_id.starts_with(&format!("blobs/{id2}/")))
            })
            .map(|(_, f)| {
                assert!(!first.contains(&f.sha256.unwrap()));
                1
            })
            .sum();
        assert!(sent <= s2.blobs_uploaded + s2.blobs_deduplicated);
        fx.check_blobs("counts", &idx2).await;
        // The marker pins the index's bytes.
        let marker: IndexMarker = m2.parse().unwrap();
        assert_eq!(marker.checkpoint_id, id2);
        assert_eq!(Sha256::of(&idx2.to_bytes().unwrap()), marker.sha256);
    }

    pub async fn nested_removed_rewritten_and_duplicate_files(h: &Harness) {
        let mut fx = Fixture::new(h);
        let tmp = tempfile::tempdir().unwrap();
        let spec = StoreSpec {
            name: "plain".into(),
            dir: tmp.path().join("plain"),
        };
        // Blob dedup of plain files: none of them inline (they would all be, as small
        // mutable files).
        let mgr = fx.manager_with(
            std::slice::from_ref(&spec),
            BackupSettings {
                inline_below: 0,
                ..Default::default()
            },
        );
        mgr.init(None).await.unwrap();

        let cp1 = tmp.path().join("cp1");
        write(&cp1.join("a"), b"version 1 of a");
        write(&cp1.join("empty"), b"");
        write(&cp1.join("sub/b"), b"b");
        write(&cp1.join("sub/deep/c"), b"c");
        write(&cp1.join("copy-of-b"), b"b");
        std::fs::create_dir_all(cp1.join("emptydir")).unwrap();
        let id1 = fx.next_id();
        let m1 = mgr
            .upload(
                id1,
                &StoreMarkers::new(),
                &BTreeMap::from([("plain".into(), cp1)]),
            )
            .await
            .unwrap();
        mgr.cleanup(id1, &m1).await.unwrap();
        let s1 = mgr.last_upload_stats()["plain"];
        assert_eq!(s1.files, 5);
        assert_eq!(s1.blobs_uploaded, 4, "copy-of-b is sent once");
        assert_eq!(s1.blobs_deduplicated, 1);

        let cp2 = tmp.path().join("cp2");
        write(&cp2.join("a"), b"version 2 of a");
        write(&cp2.join("empty"), b"");
        write(&cp2.join("sub/b"), b"b");
        write(&cp2.join("sub/new"), b"version 1 of a"); // a's old bytes: no upload
        write(&cp2.join("copy-of-b"), b"b");
        let id2 = fx.next_id();
        let m2 = mgr
            .upload(
                id2,
                &StoreMarkers::new(),
                &BTreeMap::from([("plain".into(), cp2)]),
            )
            .await
            .unwrap();
        mgr.cleanup(id2, &m2).await.unwrap();
        let s2 = mgr.last_upload_stats()["plain"];
        assert_eq!(s2.diff.files_added, 2, "{s2:?}");
        assert_eq!(s2.blobs_uploaded, 1, "only a's new version: {s2:?}");
        assert_eq!(s2.blobs_deduplicated, 1);
        assert_eq!(s2.diff.files_removed, 2, "old a and sub/deep/c: {s2:?}");

        let idx = fx.index("plain", &m2["plain"]).await;
        let paths: Vec<String> = idx.present_files().into_iter().map(|(p, _)| p).collect();
        assert_eq!(paths, ["a", "copy-of-b", "empty", "sub/b", "sub/new"]);
        assert_eq!(idx.dir_index.files_removed.len(), 1);
        assert_eq!(idx.dir_index.files_removed[0].file_name, "a");
        let sub = idx
            .dir_index
            .sub_dirs_present
            .iter()
            .find(|d| d.dir_name == "sub")
            .unwrap();
        assert_eq!(sub.sub_dirs_removed[0].dir_name, "deep");
        assert!(idx
            .dir_index
            .sub_dirs_removed
            .iter()
            .any(|d| d.dir_name == "emptydir"));
        fx.check_blobs("plain", &idx).await;
    }

    pub async fn empty_store_and_empty_dir(h: &Harness) {
        let mut fx = Fixture::new(h);
        let tmp = tempfile::tempdir().unwrap();
        // A RocksDB store that was opened but never written.
        let db = RocksStore::open("empty", &tmp.path().join("empty")).unwrap();
        let spec = StoreSpec {
            name: "empty".into(),
            dir: db.dir().to_path_buf(),
        };
        let mgr = fx.manager(std::slice::from_ref(&spec));
        mgr.init(None).await.unwrap();
        let (_, m, s) = commit_rocks(&mut fx, &mgr, &db).await;
        assert!(s.files >= 3, "CURRENT, MANIFEST, OPTIONS at least: {s:?}");
        let idx = fx.index("empty", &m).await;
        assert!(!idx.present_files().iter().any(|(p, _)| p.ends_with(".sst")));
        fx.check_blobs("empty", &idx).await;
        // A checkpoint dir with no files at all.
        let cp = tmp.path().join("nothing");
        std::fs::create_dir_all(&cp).unwrap();
        let id = fx.next_id();
        let m = mgr
            .upload(
                id,
                &StoreMarkers::new(),
                &BTreeMap::from([("empty".into(), cp)]),
            )
            .await
            .unwrap();
        let idx = fx.index("empty", &m["empty"]).await;
        assert!(idx.present_files().is_empty());
        assert_eq!(mgr.last_upload_stats()["empty"].diff.files_removed, s.files);
    }

    pub async fn large_file_goes_multipart(h: &Harness) {
        if h.name.starts_with("s3s-fs") {
            // s3s-fs keeps multipart metadata in one file named after the base64 of the whole
            // key; blobsnap's blob keys (~150 bytes) overflow NAME_MAX there (HTTP 500).
            return h.lacks("multipart uploads of keys longer than ~140 bytes");
        }
        let mut fx = Fixture::new(h);
        let tmp = tempfile::tempdir().unwrap();
        let spec = StoreSpec {
            name: "big".into(),
            dir: tmp.path().join("big"),
        };
        let mgr = fx.manager(std::slice::from_ref(&spec));
        mgr.init(None).await.unwrap();
        let cp = tmp.path().join("cp");
        let mut data = vec![0u8; (6 << 20) + 17];
        use rand::{RngCore as _, SeedableRng as _};
        rand::rngs::StdRng::seed_from_u64(9).fill_bytes(&mut data);
        write(&cp.join("000009.sst"), &data);
        write(&cp.join("CURRENT"), b"MANIFEST-000001\n");
        let id = fx.next_id();
        let m = mgr
            .upload(
                id,
                &StoreMarkers::new(),
                &BTreeMap::from([("big".into(), cp)]),
            )
            .await
            .unwrap();
        let s = mgr.last_upload_stats()["big"];
        assert_eq!(
            (s.blobs_uploaded, s.files_inline),
            (1, 1),
            "CURRENT inline: {s:?}"
        );
        if matches!(h.kind, support::Kind::S3(_)) {
            // 2 parts + create + complete, 1 index PUT (CURRENT rides in it)
            assert_eq!(s.requests, 4 + 1, "{}: {s:?}", h.name);
        }
        let idx = fx.index("big", &m["big"]).await;
        fx.check_blobs("big", &idx).await;
    }

    pub async fn two_stores_upload_concurrently(h: &Harness) {
        let mut fx = Fixture::new(h);
        let tmp = tempfile::tempdir().unwrap();
        let a = RocksStore::open("a", &tmp.path().join("a")).unwrap();
        let b = RocksStore::open("b", &tmp.path().join("b")).unwrap();
        write_keys(&a, 0, 500, 3);
        write_keys(&b, 0, 700, 4);
        let specs: Vec<StoreSpec> = [&a, &b]
            .iter()
            .map(|db| StoreSpec {
                name: db.name().into(),
                dir: db.dir().to_path_buf(),
            })
            .collect();
        let mgr = fx.manager(&specs);
        mgr.init(None).await.unwrap();
        let id = fx.next_id();
        let mut dirs = BTreeMap::new();
        for (db, spec) in [&a, &b].iter().zip(&specs) {
            let cp = spec.checkpoint_dir(id);
            db.checkpoint_to(&cp).unwrap();
            dirs.insert(spec.name.clone(), cp);
        }
        let markers = mgr.upload(id, &StoreMarkers::new(), &dirs).await.unwrap();
        assert_eq!(markers.len(), 2);
        for name in ["a", "b"] {
            let idx = fx.index(name, &markers[name]).await;
            assert_eq!(idx.snapshot_metadata.store_name, name);
            fx.check_blobs(name, &idx).await;
        }
        // A missing dir for a configured store is an input error, not a partial upload.
        let e = mgr
            .upload(fx.next_id(), &StoreMarkers::new(), &BTreeMap::new())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
    }

    pub async fn failed_upload_does_not_wedge_or_become_baseline(h: &Harness) {
        let mut fx = Fixture::new(h);
        let faulty = Arc::new(FaultStore::new(
            Arc::clone(&fx.store),
            FaultConfig {
                error_rate: OpRates {
                    put: 1.0,
                    ..Default::default()
                },
                seed: 3,
                ..Default::default()
            },
        ));
        faulty.set_enabled(false);
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("s");
        let spec = StoreSpec {
            name: "s".into(),
            dir: dir.clone(),
        };
        let mgr = BlobBackupManager::new(
            Arc::clone(&faulty) as Arc<dyn BlobStore>,
            fx.task.clone(),
            std::slice::from_ref(&spec),
            Arc::clone(&fx.clock),
            BackupSettings::default(),
        )
        .unwrap();
        mgr.init(None).await.unwrap();
        let db = RocksStore::open("s", &dir).unwrap();
        write_keys(&db, 0, 300, 5);
        let (_, m1, _) = commit_rocks(&mut fx, &mgr, &db).await;

        // A failing PUT fails the upload with a classified error.
        write_keys(&db, 300, 300, 6);
        faulty.set_enabled(true);
        let id = fx.next_id();
        db.checkpoint_to(&spec.checkpoint_dir(id)).unwrap();
        let e = mgr
            .upload(
                id,
                &StoreMarkers::new(),
                &BTreeMap::from([("s".into(), spec.checkpoint_dir(id))]),
            )
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Transient, "{e}");
        faulty.set_enabled(false);

        // An upload that succeeds but whose checkpoint is never written.
        let id = fx.next_id();
        db.checkpoint_to(&spec.checkpoint_dir(id)).unwrap();
        let orphan = mgr
            .upload(
                id,
                &StoreMarkers::new(),
                &BTreeMap::from([("s".into(), spec.checkpoint_dir(id))]),
            )
            .await
            .unwrap();

        // The next commit works and diffs against the last *committed* index.
        let (_, m3, _) = commit_rocks(&mut fx, &mgr, &db).await;
        let idx3 = fx.index("s", &m3).await;
        assert_eq!(
            idx3.prev_snapshot_index_blob_id.as_deref(),
            Some(m1.as_str())
        );
        assert_ne!(orphan["s"], m3);
        assert_eq!(mgr.committed_marker("s").unwrap().to_string(), m3);
    }

    pub async fn hash_cache_skips_unchanged_ssts(h: &Harness) {
        let mut fx = Fixture::new(h);
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("c");
        let spec = StoreSpec {
            name: "c".into(),
            dir: dir.clone(),
        };
        let mgr = fx.manager(std::slice::from_ref(&spec));
        mgr.init(None).await.unwrap();
        let db = RocksStore::open("c", &dir).unwrap();
        write_keys(&db, 0, 3000, 7);
        let (_, _, s1) = commit_rocks(&mut fx, &mgr, &db).await;
        assert_eq!(s1.hash_cache_hits, 0);
        let idx_sst = |stats: &UploadStats| stats.files; // for messages
        let (_, m2, s2) = commit_rocks(&mut fx, &mgr, &db).await;
        let idx2 = fx.index("c", &m2).await;
        let (sst_files, sst_bytes): (u64, u64) = idx2
            .present_files()
            .iter()
            .filter(|(p, _)| p.ends_with(".sst"))
            .fold((0, 0), |(n, b), (_, f)| (n + 1, b + f.file_metadata.size));
        let total: u64 = idx2
            .present_files()
            .iter()
            .map(|(_, f)| f.file_metadata.size)
            .sum();
        assert!(sst_files >= 1);
        assert_eq!(
            s2.hash_cache_hits,
            sst_files,
            "{} files: {s2:?}",
            idx_sst(&s2)
        );
        assert_eq!(
            s2.bytes_hashed,
            total - sst_bytes,
            "no SST byte is read again: {s2:?}"
        );
        assert_eq!(s2.blobs_uploaded, 0, "nothing changed: {s2:?}");

        // Across a restart: a new manager loads the cache from disk.
        drop(mgr);
        let mgr = fx.manager(std::slice::from_ref(&spec));
        let cp = Checkpoint::V2(CheckpointV2 {
            id: m2.parse::<IndexMarker>().unwrap().checkpoint_id,
            input_offsets: Default::default(),
            state_checkpoint_markers: BTreeMap::from([(
                FACTORY_NAME.to_string(),
                BTreeMap::from([("c".to_string(), m2.clone())]),
            )]),
        });
        mgr.init(Some(&cp)).await.unwrap();
        let (_, _, s3) = commit_rocks(&mut fx, &mgr, &db).await;
        assert_eq!(s3.hash_cache_hits, sst_files, "{s3:?}");
        assert_eq!(s3.blobs_uploaded, 0, "{s3:?}");
    }

    pub async fn bad_input_is_refused(h: &Harness) {
        let mut fx = Fixture::new(h);
        let tmp = tempfile::tempdir().unwrap();
        let spec = StoreSpec {
            name: "x".into(),
            dir: tmp.path().join("x"),
        };
        let mgr = fx.manager(std::slice::from_ref(&spec));
        mgr.init(None).await.unwrap();
        // A symlink in a snapshot is refused, naming it.
        let cp = tmp.path().join("cp");
        write(&cp.join("f"), b"f");
        std::os::unix::fs::symlink("/etc/passwd", cp.join("link")).unwrap();
        let e = mgr
            .upload(
                fx.next_id(),
                &StoreMarkers::new(),
                &BTreeMap::from([("x".into(), cp.clone())]),
            )
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(e.to_string().contains("symbolic link"), "{e}");
        std::fs::remove_file(cp.join("link")).unwrap();
        let id = fx.next_id();
        let markers = mgr
            .upload(
                id,
                &StoreMarkers::new(),
                &BTreeMap::from([("x".into(), cp)]),
            )
            .await
            .unwrap();

        let checkpoint = |marker: &str| {
            Checkpoint::V2(CheckpointV2 {
                id,
                input_offsets: Default::default(),
                state_checkpoint_markers: BTreeMap::from([(
                    FACTORY_NAME.to_string(),
                    BTreeMap::from([("x".to_string(), marker.to_string())]),
                )]),
            })
        };
        // Another task's manager must not accept this store's marker.
        let mut other = fx.task.clone();
        other.task_name = "Partition 1".into();
        let foreign = BlobBackupManager::new(
            Arc::clone(&fx.store),
            other,
            std::slice::from_ref(&spec),
            Arc::clone(&fx.clock),
            BackupSettings::default(),
        )
        .unwrap();
        let e = foreign
            .init(Some(&checkpoint(&markers["x"])))
            .await
            .unwrap_err();
        assert_eq!(
            e.kind(),
            ErrorKind::NotFound,
            "another task's scope has no such index: {e}"
        );
        // A malformed marker, and a well-formed one naming no index.
        let e = mgr
            .init(Some(&checkpoint("index/../../x.json")))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        let missing = IndexMarker {
            checkpoint_id: id,
            sha256: Sha256::of(b"nothing"),
        }
        .to_string();
        let e = mgr.init(Some(&checkpoint(&missing))).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
        // The real marker is accepted.
        mgr.init(Some(&checkpoint(&markers["x"]))).await.unwrap();
        assert_eq!(mgr.committed_marker("x").unwrap().to_string(), markers["x"]);
    }

    /// An unchanged store costs no request (issue 19 §1): a commit whose snapshot holds
    /// exactly the files of the committed one makes no request at all and hands back that
    /// marker; a checkpoint naming the carried marker (its index names an older checkpoint)
    /// restores the store's keys; a sweep whose roots all name the carried marker keeps its
    /// index and blobs; cleanup keeps them while a retained checkpoint names it, and deletes
    /// them once none does; a restore refuses an index newer than the checkpoint naming it.
    pub async fn unchanged_store_carries_its_marker_forward(h: &Harness) {
        use blobsnap::backend::TaskRestoreManager as _;
        use blobsnap::blob::restore::{BlobRestoreManager, RestoreSettings};
        let mut fx = Fixture::new(h);
        let tmp = tempfile::tempdir().unwrap();
        let spec = StoreSpec {
            name: "counts".into(),
            dir: tmp.path().join("counts"),
        };
        let mgr = fx.manager(std::slice::from_ref(&spec));
        mgr.init(None).await.unwrap();
        let db = RocksStore::open("counts", &spec.dir).unwrap();
        write_keys(&db, 0, 2000, 1);
        let (id1, m1, s1) = commit_rocks(&mut fx, &mgr, &db).await;
        assert!(!s1.carried_forward);
        let idx1 = fx.index("counts", &m1).await;
        let cp = |id: CheckpointId, marker: &str| checkpoint_of(id, "counts", marker);
        let keys_of = |dir: &Path| -> Vec<(Vec<u8>, Vec<u8>)> {
            let db = RocksStore::open("counts", dir).unwrap();
            db.db()
                .iterator(rocksdb::IteratorMode::Start)
                .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())).unwrap())
                .collect()
        };
        let (r_store, r_task) = (Arc::clone(&fx.store), fx.task.clone());
        let restore_to = |name: &str, checkpoint: Checkpoint| {
            let dir = tmp.path().join(name);
            let store = Arc::clone(&r_store);
            let task = r_task.clone();
            async move {
                let spec = StoreSpec {
                    name: "counts".into(),
                    dir: dir.clone(),
                };
                let r = BlobRestoreManager::new(
                    store,
                    task,
                    std::slice::from_ref(&spec),
                    RestoreSettings::default(),
                )
                .unwrap();
                r.init(Some(&checkpoint)).await?;
                r.restore().await.map(|()| dir)
            }
        };
        let want: Vec<(Vec<u8>, Vec<u8>)> = db
            .db()
            .iterator(rocksdb::IteratorMode::Start)
            .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())).unwrap())
            .collect();

        // Three commits with no write: no request at all, the first marker each time.
        let mut last = id1;
        let mut ids = vec![id1];
        for round in 0..3 {
            let before = fx.counters.snapshot();
            let (id, m, s) = commit_rocks(&mut fx, &mgr, &db).await;
            let d = fx.counters.snapshot().since(&before);
            assert_eq!(m, m1, "{}: round {round} carried the marker", h.name);
            assert!(s.carried_forward && s.requests == 0, "{s:?}");
            assert_eq!(s.files, idx1.present_files().len() as u64, "{s:?}");
            let requests = d.put.calls
                + d.get.calls
                + d.head.calls
                + d.delete.calls
                + d.list.calls
                + d.multipart.calls;
            assert_eq!(requests, 0, "{}: round {round}: {d:?}", h.name);
            last = id;
            ids.push(id);
        }
        // A sweep (grace 0) with the four checkpoints as its roots, all naming the first
        // index: the carried index and every blob it names stay.
        let sweep = blobsnap::blob::gc::SweepSettings {
            job_name: fx.task.job_name.clone(),
            job_id: fx.task.job_id.clone(),
            task: None,
            store: None,
            grace: std::time::Duration::ZERO,
        };
        let carried_key = JobScope::new(&fx.task.job_name, &fx.task.job_id)
            .unwrap()
            .store(&fx.task.task_name, "counts")
            .unwrap()
            .index_key(&m1.parse().unwrap())
            .unwrap();
        // The control: with no checkpoint naming it, the sweep would take the index.
        let unrooted = blobsnap::blob::gc::plan_sweep_read_only(&fx.store, &sweep)
            .await
            .unwrap();
        assert!(
            unrooted
                .delete
                .iter()
                .any(|d| d.key == carried_key.as_str()),
            "{}: {unrooted:?}",
            h.name
        );
        let cps = blobsnap::checkpoint::BlobCheckpointStore::new(
            Arc::clone(&fx.store),
            JobScope::new(&fx.task.job_name, &fx.task.job_id).unwrap(),
        );
        for (seq, id) in ids.iter().enumerate() {
            use blobsnap::checkpoint::CheckpointStore as _;
            cps.write(&fx.task.task_name, seq as u64 + 1, "test", &cp(*id, &m1))
                .await
                .unwrap();
        }
        let plan = blobsnap::blob::gc::plan_sweep(&fx.store, &sweep)
            .await
            .unwrap();
        assert_eq!(plan.roots, 4, "{}", h.name);
        assert!(
            !plan.delete.iter().any(|d| d.key == carried_key.as_str()),
            "{}: {plan:?}",
            h.name
        );
        blobsnap::blob::gc::execute_sweep(fx.store.as_ref(), &plan)
            .await
            .unwrap();
        assert_eq!(
            fx.index("counts", &m1).await,
            idx1,
            "{}: the carried index survives the sweep",
            h.name
        );
        // The last checkpoint names the first index: it restores, and the carried snapshot
        // is still whole (cleanup ran after every commit, with retention 2).
        let dir = restore_to("restored", cp(last, &m1)).await.unwrap();
        assert_eq!(keys_of(&dir), want, "{}", h.name);
        fx.check_blobs("counts", &idx1).await;

        // Two changes: the carried snapshot leaves retention, its index goes with it.
        write_keys(&db, 2000, 1000, 2);
        let (_, m5, s5) = commit_rocks(&mut fx, &mgr, &db).await;
        assert!(!s5.carried_forward && m5 != m1, "{s5:?}");
        assert_eq!(
            fx.index("counts", &m5)
                .await
                .prev_snapshot_index_blob_id
                .as_deref(),
            Some(m1.as_str())
        );
        write_keys(&db, 3000, 1000, 3);
        let (id6, m6, _) = commit_rocks(&mut fx, &mgr, &db).await;
        let scope = JobScope::new(&fx.task.job_name, &fx.task.job_id)
            .unwrap()
            .store(&fx.task.task_name, "counts")
            .unwrap();
        let e = fx
            .store
            .head(&scope.index_key(&m1.parse().unwrap()).unwrap())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{}: {e}", h.name);
        let dir = restore_to("restored-6", cp(id6, &m6)).await.unwrap();
        assert_eq!(keys_of(&dir).len(), 4000);

        // An index newer than the checkpoint naming it is not that checkpoint's.
        let e = restore_to("refused", cp(id1, &m6)).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
        assert!(e.to_string().contains("newer than the checkpoint"), "{e}");
    }

    /// Small files travel inline (issue 19 §1): a commit that adds one SST makes exactly two
    /// requests, the SST's PUT and the index's — the changed MANIFEST (and every file under
    /// 64 KiB) rides in the index, format-version 2 — and the snapshot restores the store's
    /// keys. An inline file of at least 4 KiB that comes back unchanged (RocksDB's OPTIONS) is
    /// a blob of its own from its first repeat on (one PUT, once; issue 32 §4: it was sent
    /// again in every index), named by every later index without a request. With
    /// `inline_below = 0` every file is a blob and the index keeps Samza's v1 shape.
    pub async fn small_files_travel_inline(h: &Harness) {
        use blobsnap::backend::TaskRestoreManager as _;
        use blobsnap::blob::restore::{BlobRestoreManager, RestoreSettings};
        let mut fx = Fixture::new(h);
        let tmp = tempfile::tempdir().unwrap();
        let spec = StoreSpec {
            name: "counts".into(),
            dir: tmp.path().join("counts"),
        };
        let mgr = fx.manager(std::slice::from_ref(&spec));
        mgr.init(None).await.unwrap();
        let db = RocksStore::open("counts", &spec.dir).unwrap();
        write_keys(&db, 0, 2000, 1);
        commit_rocks(&mut fx, &mgr, &db).await;
        let requests_of = |d: &blobsnap::blobstore::counting::CountSnapshot| {
            d.put.calls
                + d.get.calls
                + d.head.calls
                + d.delete.calls
                + d.list.calls
                + d.multipart.calls
        };
        // The second commit: the new SST, the OPTIONS file's first repeat (now a blob), the
        // index.
        write_keys(&db, 2000, 1000, 2);
        let before = fx.counters.snapshot();
        let (_, m2, s2) = commit_rocks(&mut fx, &mgr, &db).await;
        let d = fx.counters.snapshot().since(&before);
        assert_eq!((d.put.calls, requests_of(&d)), (3, 3), "{}: {d:?}", h.name);
        assert_eq!((s2.blobs_uploaded, s2.requests), (2, 3), "{s2:?}");
        let idx2 = fx.index("counts", &m2).await;
        let options_blob = |idx: &blobsnap::index::SnapshotIndex| {
            let (_, f) = idx
                .present_files()
                .into_iter()
                .find(|(p, _)| p.starts_with("OPTIONS-"))
                .expect("an OPTIONS file");
            assert!(f.file_metadata.size >= blobsnap::blob::backup::SHARE_INLINE_FROM);
            assert!(f.inline_data.is_none(), "OPTIONS is a blob: {f:?}");
            f.blobs[0].blob_id.clone()
        };
        let shared = options_blob(&idx2);
        // The third: two uploads, the SST's PUT and the index's, and nothing read (the
        // retention of 2 then lets the first snapshot go: one LIST and one batch delete).
        write_keys(&db, 3000, 1000, 4);
        let before = fx.counters.snapshot();
        let (id3, m3, s3) = commit_rocks(&mut fx, &mgr, &db).await;
        let d = fx.counters.snapshot().since(&before);
        assert_eq!(
            (d.put.calls, requests_of(&d) - d.delete.calls - d.list.calls),
            (2, 2),
            "{}: {d:?}",
            h.name
        );
        assert_eq!((s3.blobs_uploaded, s3.requests), (1, 2), "{s3:?}");
        assert!(s3.files_inline >= 1, "the new MANIFEST went inline: {s3:?}");
        let idx3 = fx.index("counts", &m3).await;
        assert_eq!(idx3.format_version, blobsnap::index::FORMAT_INLINE);
        assert_eq!(options_blob(&idx3), shared, "the same blob, no new PUT");
        for (path, f) in idx3.present_files() {
            let small = f.file_metadata.size < blobsnap::blob::backup::INLINE_BELOW
                && !path.ends_with(".sst")
                && !path.starts_with("OPTIONS-");
            assert_eq!(f.inline_data.is_some(), small, "{path}: {f:?}");
            assert_eq!(f.blobs.is_empty(), small, "{path}");
        }
        fx.check_blobs("counts", &idx3).await;
        // The MANIFEST it replaced is named among the removed files without its bytes: they
        // are in the previous index (issue 32 §4: a second copy of it made a third of every
        // index). Name, size and SHA-256 stay; the index parsed above with it.
        let manifest = |files: Vec<&blobsnap::index::FileIndex>| {
            files
                .into_iter()
                .find(|f| f.file_name.starts_with("MANIFEST-"))
                .cloned()
                .expect("a MANIFEST entry")
        };
        let before = manifest(idx2.present_files().into_iter().map(|(_, f)| f).collect());
        assert!(before.inline_data.is_some(), "{before:?}");
        let removed = manifest(idx3.dir_index.files_removed.iter().collect());
        assert_eq!(
            (
                &removed.file_name,
                removed.sha256,
                removed.file_metadata.size
            ),
            (&before.file_name, before.sha256, before.file_metadata.size)
        );
        assert!(
            idx3.dir_index
                .files_removed
                .iter()
                .all(|f| f.inline_data.is_none()),
            "{:?}",
            idx3.dir_index.files_removed
        );
        // It restores: the inline files are written from the index, verified.
        let dst = StoreSpec {
            name: "counts".into(),
            dir: tmp.path().join("restored"),
        };
        let r = BlobRestoreManager::new(
            Arc::clone(&fx.store),
            fx.task.clone(),
            std::slice::from_ref(&dst),
            RestoreSettings::default(),
        )
        .unwrap();
        r.init(Some(&checkpoint_of(id3, "counts", &m3)))
            .await
            .unwrap();
        r.restore().await.unwrap();
        let keys = |db: &RocksStore| db.db().iterator(rocksdb::IteratorMode::Start).count();
        assert_eq!(keys(&RocksStore::open("counts", &dst.dir).unwrap()), 4000);

        // Samza's shape on request: no inline file, format-version 1, no `inline-data` field.
        let v1 = StoreSpec {
            name: "v1".into(),
            dir: tmp.path().join("v1"),
        };
        let mgr = fx.manager_with(
            std::slice::from_ref(&v1),
            BackupSettings {
                inline_below: 0,
                ..Default::default()
            },
        );
        mgr.init(None).await.unwrap();
        let db = RocksStore::open("v1", &v1.dir).unwrap();
        write_keys(&db, 0, 500, 3);
        let (_, m, s) = commit_rocks(&mut fx, &mgr, &db).await;
        assert_eq!(s.files_inline, 0);
        let idx = fx.index("v1", &m).await;
        assert_eq!(idx.format_version, blobsnap::index::FORMAT_V1);
        assert!(idx.present_files().iter().all(|(_, f)| f.blobs.len() == 1));
        let text = String::from_utf8(idx.to_bytes().unwrap()).unwrap();
        assert!(!text.contains("inline-data"), "{text}");
    }
}

store_suites!([
    small_files_travel_inline,
    unchanged_store_carries_its_marker_forward,
    second_commit_sends_only_new_content,
    nested_removed_rewritten_and_duplicate_files,
    empty_store_and_empty_dir,
    large_file_goes_multipart,
    two_stores_upload_concurrently,
    failed_upload_does_not_wedge_or_become_baseline,
    hash_cache_skips_unchanged_ssts,
    bad_input_is_refused,
]);

/// Settings that only a real S3 server can show: run by scripts/test.sh with the external
/// suites (`external::` in the name).
mod s3_external {
    use super::*;
    use blobsnap::backend::{
        StoreMarkers, StoreSpec, SystemClock, TaskContext, TaskRestoreManager as _,
    };
    use blobsnap::blob::restore::{BlobRestoreManager, RestoreSettings};
    use blobsnap::blobstore::s3::{PartChecksum, S3Store, Sse};
    use support::Kind;

    /// SSE-S3 and SSE-KMS: every object a backup writes (blobs, the multipart one included,
    /// and the index) carries the encryption the settings ask for, read back with HEAD; with
    /// `part-checksum = "sha256"` the multipart blob carries a SHA-256 composite checksum
    /// (CRC-32C by default); and the snapshot restores byte for byte. (LocalStack reports
    /// AES256 for an object put without SSE too, so there the KMS case is the one that
    /// proves the setting reaches the server.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs BLOBSNAP_TEST_S3_ENDPOINT; run by scripts/test.sh"]
    async fn sse_and_part_checksums_are_what_the_settings_ask_for() {
        use aws_sdk_s3::types::{ChecksumMode, ServerSideEncryption};
        let h = support::external().await;
        if std::env::var("BLOBSNAP_TEST_S3_SSE").as_deref() == Ok("false") {
            assert_ne!(
                std::env::var("BLOBSNAP_TEST_S3_SERVER").as_deref(),
                Ok("localstack"),
                "LocalStack runs the SSE case"
            );
            return h.lacks("SSE-S3 / SSE-KMS");
        }
        let Kind::S3(base) = &h.kind else {
            unreachable!("external() is S3")
        };
        let ak = std::env::var("BLOBSNAP_TEST_S3_ACCESS_KEY").unwrap_or_else(|_| "test".into());
        let sk = std::env::var("BLOBSNAP_TEST_S3_SECRET_KEY").unwrap_or_else(|_| "test".into());
        let key_arn = "arn:aws:kms:us-east-1:000000000000:key/0b7c3f1e-5d2a-4c8e-9f31-6a2d4e8b1c07";
        let tmp = tempfile::tempdir().unwrap();
        let big: Vec<u8> = (0..(11u32 << 20))
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let cases = [
            ("SSE-S3, CRC-32C parts", Sse::S3, PartChecksum::Crc32c),
            (
                "SSE-KMS, SHA-256 parts",
                Sse::Kms {
                    key_id: Some(key_arn.into()),
                },
                PartChecksum::Sha256,
            ),
        ];
        for (n, (what, sse, part_checksum)) in cases.into_iter().enumerate() {
            let mut config = base.config().clone();
            config.sse = sse.clone();
            config.part_checksum = part_checksum;
            let s3 = S3Store::connect_with_credentials(config.clone(), &ak, &sk, None)
                .await
                .unwrap();
            let store: Arc<dyn BlobStore> = Arc::new(s3.clone());
            let ctx = TaskContext {
                job_name: h.scope.as_str().trim_end_matches('/').to_string(),
                job_id: "1".into(),
                task_name: format!("Partition {n}"),
            };
            let spec = StoreSpec {
                name: "counts".into(),
                dir: tmp.path().join(format!("src{n}")),
            };
            let id: CheckpointId = format!("{}-0", 1_800_000_000_000u64 + n as u64)
                .parse()
                .unwrap();
            let snap = spec.checkpoint_dir(id);
            std::fs::create_dir_all(&snap).unwrap();
            std::fs::write(snap.join("000007.sst"), &big).unwrap();
            // Over the inline threshold: a single PUT of its own.
            std::fs::write(snap.join("MANIFEST-000001"), vec![b'm'; 100_000]).unwrap();
            let mgr = BlobBackupManager::new(
                Arc::clone(&store),
                ctx.clone(),
                std::slice::from_ref(&spec),
                Arc::new(SystemClock),
                BackupSettings::default(),
            )
            .unwrap();
            mgr.init(None).await.unwrap();
            let markers = mgr
                .upload(
                    id,
                    &StoreMarkers::new(),
                    &BTreeMap::from([("counts".into(), snap.clone())]),
                )
                .await
                .unwrap();
            let marker = markers["counts"].clone();
            let sscope = JobScope::new(&ctx.job_name, "1")
                .unwrap()
                .store(&ctx.task_name, "counts")
                .unwrap();
            let idx = support::index_of_store(store.as_ref(), &ctx, "counts", &marker).await;
            let mut keys = vec![(sscope.key(&marker).unwrap(), false)];
            for (path, f) in idx.present_files() {
                keys.push((
                    sscope.key(&f.blobs[0].blob_id).unwrap(),
                    path.ends_with(".sst"),
                ));
            }
            assert_eq!(keys.len(), 3, "{what}: the index and two blobs");
            for (key, multipart) in keys {
                let object = format!("{}{}", config.prefix, key.as_str());
                let head = s3
                    .client()
                    .head_object()
                    .bucket(&config.bucket)
                    .key(&object)
                    .checksum_mode(ChecksumMode::Enabled)
                    .send()
                    .await
                    .unwrap();
                match &sse {
                    Sse::S3 => assert_eq!(
                        head.server_side_encryption(),
                        Some(&ServerSideEncryption::Aes256),
                        "{what}: {object}"
                    ),
                    _ => {
                        assert_eq!(
                            head.server_side_encryption(),
                            Some(&ServerSideEncryption::AwsKms),
                            "{what}: {object}"
                        );
                        assert_eq!(head.ssekms_key_id(), Some(key_arn), "{what}: {object}");
                    }
                }
                if multipart {
                    let (sha, crc) = (head.checksum_sha256(), head.checksum_crc32_c());
                    match part_checksum {
                        PartChecksum::Sha256 => assert!(
                            sha.is_some_and(|c| c.ends_with("-3")) && crc.is_none(),
                            "{what}: a composite SHA-256 of 3 parts: {sha:?} {crc:?}"
                        ),
                        PartChecksum::Crc32c => assert!(
                            crc.is_some_and(|c| c.ends_with("-3")) && sha.is_none(),
                            "{what}: a composite CRC-32C of 3 parts: {sha:?} {crc:?}"
                        ),
                    }
                }
            }
            // And it restores byte for byte.
            let back = StoreSpec {
                name: "counts".into(),
                dir: tmp.path().join(format!("back{n}")),
            };
            let r = BlobRestoreManager::new(
                Arc::clone(&store),
                ctx.clone(),
                std::slice::from_ref(&back),
                RestoreSettings::default(),
            )
            .unwrap();
            let cp = Checkpoint::V2(CheckpointV2 {
                id,
                input_offsets: Default::default(),
                state_checkpoint_markers: BTreeMap::from([(
                    FACTORY_NAME.to_string(),
                    BTreeMap::from([("counts".to_string(), marker)]),
                )]),
            });
            r.init(Some(&cp)).await.unwrap();
            r.restore().await.unwrap();
            assert_eq!(
                std::fs::read(back.dir.join("000007.sst")).unwrap(),
                big,
                "{what}"
            );
            assert_eq!(
                std::fs::read(back.dir.join("MANIFEST-000001")).unwrap(),
                vec![b'm'; 100_000],
                "{what}"
            );
        }
        h.cleanup().await;
    }
}

/// A checkpoint the way RocksDB makes one: `cp` holds hard links of the files of `live`.
fn link_checkpoint(live: &Path, cp: &Path) -> std::path::PathBuf {
    std::fs::create_dir_all(cp).unwrap();
    for e in std::fs::read_dir(live).unwrap().flatten() {
        std::fs::hard_link(e.path(), cp.join(e.file_name())).unwrap();
    }
    cp.to_path_buf()
}

/// What the hash cache promises, for files immutable by contract (`*.sst`): a cached digest
/// is used only for the same name, device, inode, size and nanosecond mtime. Any rewrite that
/// changes the size or the mtime, and any replacement by a new inode, is hashed again; a
/// damaged cache file is ignored (everything hashed again). A rewrite in place that keeps
/// the size *and* sets the mtime back to the nanosecond (RocksDB never does either: an SST is
/// never rewritten) is not detected: the backup records the digest hashed before, and stays
/// self-consistent (its blobs match its index). Documented in docs/reliability.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hash_cache_trusts_exactly_its_key() {
    use std::os::unix::fs::MetadataExt as _;
    let h = support::local().await;
    let mut fx = Fixture::new(&h);
    let tmp = tempfile::tempdir().unwrap();
    let spec = StoreSpec {
        name: "c".into(),
        dir: tmp.path().join("c"),
    };
    let live = &spec.dir;
    let random = |seed: u8| -> Vec<u8> {
        (0..65_536u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8 ^ seed)
            .collect()
    };
    write(&live.join("000001.sst"), &random(1));
    write(&live.join("000002.sst"), &random(2));
    write(&live.join("MANIFEST-000001"), b"manifest");
    let mgr = fx.manager(std::slice::from_ref(&spec));
    mgr.init(None).await.unwrap();
    let commit = async |fx: &mut Fixture| {
        let id = fx.next_id();
        let cp = link_checkpoint(live, &spec.checkpoint_dir(id));
        let markers = mgr
            .upload(
                id,
                &StoreMarkers::new(),
                &BTreeMap::from([("c".into(), cp)]),
            )
            .await
            .unwrap();
        mgr.cleanup(id, &markers).await.unwrap();
        let idx = fx.index("c", &markers["c"]).await;
        fx.check_blobs("c", &idx).await;
        let sha = idx
            .present_files()
            .into_iter()
            .find(|(p, _)| p == "000001.sst")
            .and_then(|(_, f)| f.sha256)
            .unwrap();
        (mgr.last_upload_stats()["c"], sha)
    };
    let sst = live.join("000001.sst");
    let rewrite_in_place = |bytes: &[u8]| {
        use std::io::Write as _;
        let mut f = std::fs::File::options().write(true).open(&sst).unwrap();
        f.write_all(bytes).unwrap();
        f.sync_all().unwrap();
    };
    let mtime = |p: &Path| {
        let m = std::fs::metadata(p).unwrap();
        std::time::UNIX_EPOCH + std::time::Duration::new(m.mtime() as u64, m.mtime_nsec() as u32)
    };

    let (s, sha1) = commit(&mut fx).await;
    assert_eq!(s.hash_cache_hits, 0, "{s:?}");
    assert_eq!(sha1, Sha256::of(&random(1)));
    let (s, _) = commit(&mut fx).await;
    assert_eq!(s.hash_cache_hits, 2, "both SSTs from the cache: {s:?}");

    // Rewritten in place, same size, a new mtime: hashed again.
    let before = mtime(&sst);
    rewrite_in_place(&random(3));
    std::fs::File::options()
        .write(true)
        .open(&sst)
        .unwrap()
        .set_modified(before + std::time::Duration::from_secs(1))
        .unwrap();
    let (s, sha3) = commit(&mut fx).await;
    assert_eq!(s.hash_cache_hits, 1, "{s:?}");
    assert_eq!(sha3, Sha256::of(&random(3)), "the new bytes were hashed");
    assert_eq!(s.blobs_uploaded, 1, "and uploaded: {s:?}");

    // Replaced by a new inode of the same name, size and mtime: hashed again.
    let stamp = mtime(&sst);
    let ino = std::fs::metadata(&sst).unwrap().ino();
    let tmpfile = live.join(".new");
    write(&tmpfile, &random(4));
    std::fs::rename(&tmpfile, &sst).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&sst)
        .unwrap()
        .set_modified(stamp)
        .unwrap();
    assert_ne!(std::fs::metadata(&sst).unwrap().ino(), ino);
    let (s, sha4) = commit(&mut fx).await;
    assert_eq!(s.hash_cache_hits, 1, "{s:?}");
    assert_eq!(sha4, Sha256::of(&random(4)));

    // The documented limit: in place, same size, the mtime set back to the nanosecond.
    let stamp = mtime(&sst);
    rewrite_in_place(&random(5));
    std::fs::File::options()
        .write(true)
        .open(&sst)
        .unwrap()
        .set_modified(stamp)
        .unwrap();
    assert_eq!(mtime(&sst), stamp);
    let (s, sha5) = commit(&mut fx).await;
    assert_eq!(s.hash_cache_hits, 2, "not detected, as documented: {s:?}");
    assert_eq!(
        sha5, sha4,
        "the digest hashed before (the backup stays self-consistent)"
    );

    // A damaged cache file is ignored: everything is hashed again, the true digest recorded.
    let cache = blobsnap::local::hashcache::HashCache::path_for(&spec.dir);
    let mut bytes = std::fs::read(&cache).unwrap();
    let at = bytes.len() / 3;
    bytes[at] ^= 0x20;
    std::fs::write(&cache, bytes).unwrap();
    drop(mgr);
    let mgr = fx.manager(std::slice::from_ref(&spec));
    mgr.init(None).await.unwrap();
    let commit = async |fx: &mut Fixture| {
        let id = fx.next_id();
        let cp = link_checkpoint(live, &spec.checkpoint_dir(id));
        mgr.upload(
            id,
            &StoreMarkers::new(),
            &BTreeMap::from([("c".into(), cp)]),
        )
        .await
        .unwrap();
        mgr.last_upload_stats()["c"]
    };
    let s = commit(&mut fx).await;
    assert_eq!(s.hash_cache_hits, 0, "the damaged cache was ignored: {s:?}");
    assert!(s.bytes_hashed >= 2 * 65_536, "{s:?}");
}

/// The inline budget (N4 of the second protocol review): a checkpoint dir of 800 small
/// mutable files of 65,000 bytes each (each under the 64 KiB inline threshold; base64 would
/// make an all-inline index ~69 MB, over the 64 MiB every reader enforces) commits an index
/// that carries at most `INLINE_BUDGET` bytes inline, the rest as blobs — and it restores,
/// byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_small_files_stay_under_the_index_cap() {
    use blobsnap::backend::TaskRestoreManager as _;
    use blobsnap::blob::backup::INLINE_BUDGET;
    use blobsnap::blob::restore::{BlobRestoreManager, RestoreSettings};
    let h = support::local().await;
    let mut fx = Fixture::new(&h);
    let tmp = tempfile::tempdir().unwrap();
    let spec = StoreSpec {
        name: "many".into(),
        dir: tmp.path().join("many"),
    };
    let mgr = fx.manager(std::slice::from_ref(&spec));
    mgr.init(None).await.unwrap();
    let cp = tmp.path().join("cp");
    for i in 0..800u32 {
        let body: Vec<u8> = (0..65_000u32).map(|j| ((i * 7 + j) % 251) as u8).collect();
        write(&cp.join(format!("f{i:04}.dat")), &body);
    }
    let id = fx.next_id();
    let m = mgr
        .upload(
            id,
            &StoreMarkers::new(),
            &BTreeMap::from([("many".into(), cp.clone())]),
        )
        .await
        .unwrap();
    let marker = m["many"].clone();
    let idx = fx.index("many", &marker).await;
    let inline: u64 = idx
        .present_files()
        .iter()
        .filter(|(_, f)| f.inline_data.is_some())
        .map(|(_, f)| f.file_metadata.size)
        .sum();
    assert!(
        inline > 0 && inline <= INLINE_BUDGET,
        "{inline} bytes inline"
    );
    assert!(
        (idx.to_bytes().unwrap().len() as u64) < blobsnap::index::MAX_INDEX_BYTES,
        "the index is under the cap"
    );
    fx.check_blobs("many", &idx).await;
    let dst = StoreSpec {
        name: "many".into(),
        dir: tmp.path().join("restored"),
    };
    let r = BlobRestoreManager::new(
        Arc::clone(&fx.store),
        fx.task.clone(),
        std::slice::from_ref(&dst),
        RestoreSettings::default(),
    )
    .unwrap();
    r.init(Some(&checkpoint_of(id, "many", &marker)))
        .await
        .unwrap();
    r.restore().await.unwrap();
    for i in 0..800u32 {
        let name = format!("f{i:04}.dat");
        assert_eq!(
            std::fs::read(dst.dir.join(&name)).unwrap(),
            std::fs::read(cp.join(&name)).unwrap(),
            "{name}"
        );
    }
}
