//! The commit protocol across restarts, lost responses and restore fallbacks (DESIGN §7): the
//! real commit manager and blob backup/restore managers on the local directory store, with
//! real RocksDB where the failure was RocksDB's.
//!
//! - a restart whose clock is behind the ids an earlier process made but never committed
//!   makes ids of its own (each claim's epoch is in its ids), so RocksDB's checkpoint of the
//!   new commit does not hit the dead process's directory;
//! - a blob key that already exists is never reused: the commit is abandoned;
//! - a checkpoint write that landed although its call failed is adopted by the next commit of
//!   the same writer, not taken for another writer's (which would fence the task off);
//! - after a restore fallback the next commit builds on the checkpoint restored, never on the
//!   newer broken one (whose blobs may be the broken ones).

use crate::support;

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use async_trait::async_trait;
use blobsnap::backend::{
    Clock, StoreEngine, StoreSpec, TaskBackupManager as _, TaskContext, TaskRestoreManager as _,
};
use blobsnap::blob::backup::{BackupSettings, BlobBackupManager};
use blobsnap::blob::restore::{BlobRestoreManager, RestoreSettings};
use blobsnap::blob::FACTORY_NAME;
use blobsnap::blobstore::local::LocalStore;
use blobsnap::blobstore::{
    BlobStore, DeleteFailures, GetResult, ObjectMeta, PutBody, PutOptions, PutResult, Scope,
};
use blobsnap::checkpoint::{
    BlobCheckpointStore, Checkpoint, CheckpointId, CheckpointStore, CheckpointV2, Ssp,
};
use blobsnap::commit::{Backend, TaskCommitManager};
use blobsnap::digest::Sha256;
use blobsnap::layout::{JobScope, StoreScope};
use blobsnap::local::rocks::RocksStore;
use blobsnap::{Error, ErrorKind, Result};
use futures::stream::BoxStream;

#[derive(Debug)]
struct At(AtomicU64);

impl Clock for At {
    fn now_millis(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

fn ctx() -> TaskContext {
    TaskContext {
        job_name: "proto".into(),
        job_id: "1".into(),
        task_name: "Partition 0".into(),
    }
}

fn offsets(n: u64) -> BTreeMap<Ssp, String> {
    BTreeMap::from([(Ssp::new("files", "lines", 0), n.to_string())])
}

/// A store engine over a plain directory of files (checkpoint = hard links): the file set of
/// each commit is exactly what the test puts there.
struct Files {
    dir: PathBuf,
}

impl StoreEngine for Files {
    fn name(&self) -> &str {
        "counts"
    }
    fn dir(&self) -> &Path {
        &self.dir
    }
    fn flush(&self) -> Result<()> {
        Ok(())
    }
    fn checkpoint_to(&self, path: &Path) -> Result<()> {
        let io = |e: std::io::Error| Error::new(ErrorKind::Io, format!("checkpoint: {e}"));
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        std::fs::create_dir(path).map_err(io)?;
        for e in std::fs::read_dir(&self.dir).map_err(io)? {
            let e = e.map_err(io)?;
            if e.file_type().map_err(io)?.is_file() {
                std::fs::hard_link(e.path(), path.join(e.file_name())).map_err(io)?;
            }
        }
        Ok(())
    }
}

/// `mgr` with `engine` and a blob backend of `settings` on `store`, `init`-ed with
/// `restored`.
async fn attach(
    mgr: TaskCommitManager,
    store: &Arc<dyn BlobStore>,
    clock: Arc<dyn Clock>,
    engine: Arc<dyn StoreEngine>,
    settings: BackupSettings,
    restored: Option<Checkpoint>,
) -> TaskCommitManager {
    let spec = StoreSpec {
        name: "counts".into(),
        dir: engine.dir().to_path_buf(),
    };
    let backup = Arc::new(
        BlobBackupManager::new(
            Arc::clone(store),
            ctx(),
            std::slice::from_ref(&spec),
            clock,
            settings,
        )
        .unwrap(),
    );
    backup.init(restored.as_ref()).await.unwrap();
    mgr.with_stores(vec![engine]).with_backends(
        vec![Backend {
            name: FACTORY_NAME.into(),
            manager: backup,
        }],
        restored,
    )
}

/// One process of the task: a claim, a backup manager `init`-ed with `restored`, the engine.
async fn process(
    store: &Arc<dyn BlobStore>,
    clock: &Arc<At>,
    engine: Arc<dyn StoreEngine>,
    retention: usize,
    restored: Option<Checkpoint>,
) -> (TaskCommitManager, Option<Checkpoint>) {
    let checkpoints: Arc<dyn CheckpointStore> = Arc::new(BlobCheckpointStore::new(
        Arc::clone(store),
        JobScope::new("proto", "1").unwrap(),
    ));
    let vclock: Arc<dyn Clock> = clock.clone();
    let (mgr, claim) =
        TaskCommitManager::start(ctx(), checkpoints, Arc::clone(&vclock), retention, false)
            .await
            .unwrap();
    let restored = restored.or_else(|| claim.clone());
    // The stores here are plain files: every one a blob (none inline), whose keys the
    // protocol cases look at.
    let settings = BackupSettings {
        retention,
        hash_cache: false,
        inline_below: 0,
        ..Default::default()
    };
    let mgr = attach(mgr, store, vclock, engine, settings, restored).await;
    (mgr, claim)
}

fn marker(c: &CheckpointV2) -> String {
    c.state_checkpoint_markers[FACTORY_NAME]["counts"].clone()
}

fn sscope() -> StoreScope {
    JobScope::new("proto", "1")
        .unwrap()
        .store("Partition 0", "counts")
        .unwrap()
}

/// Restore `checkpoint` into `dir` (which must not exist yet).
async fn restore(store: &Arc<dyn BlobStore>, checkpoint: &Checkpoint, dir: &Path) -> Result<()> {
    let spec = StoreSpec {
        name: "counts".into(),
        dir: dir.to_path_buf(),
    };
    let r = BlobRestoreManager::new(
        Arc::clone(store),
        ctx(),
        std::slice::from_ref(&spec),
        RestoreSettings::default(),
    )?;
    r.init(Some(checkpoint)).await?;
    r.restore().await
}

/// A restart on a host whose clock is behind the last committed id: the crashed process made
/// id X (its RocksDB checkpoint dir is still there) and never committed it; the next process
/// starts from the same committed id with the same clock. Before ids carried the claim's
/// epoch it made X again and RocksDB refused the checkpoint ("Directory exists") at every
/// restart until the clock caught up.
#[tokio::test]
async fn a_restart_with_the_clock_behind_never_remakes_an_uncommitted_id() {
    let tmp = tempfile::tempdir().unwrap();
    let store: Arc<dyn BlobStore> = Arc::new(LocalStore::new(tmp.path().join("store")).unwrap());
    let dir = tmp.path().join("state/counts");
    let t = 1_800_000_000_000;
    let clock = Arc::new(At(AtomicU64::new(t)));

    let db = Arc::new(RocksStore::open("counts", &dir).unwrap());
    db.db().put(b"k1", b"v1").unwrap();
    let (first, _) = process(&store, &clock, db.clone(), 2, None).await;
    let committed = first.commit(offsets(1)).await.unwrap().checkpoint.id;
    drop(first);

    // The clock steps back 10 s. A process claims, makes its sync stage, and dies.
    clock.0.store(t - 10_000, Relaxed);
    db.db().put(b"k2", b"v2").unwrap();
    let (dying, _) = process(&store, &clock, db.clone(), 2, None).await;
    let orphan = dying.sync_stage(offsets(2)).await.unwrap().id;
    drop(dying);
    assert!(orphan > committed);

    // The next process, same host, same clock: its commit must go through, under an id of
    // its own.
    let (next, _) = process(&store, &clock, db.clone(), 2, None).await;
    let report = next
        .commit(offsets(2))
        .await
        .expect("a restart with the clock behind commits");
    let id = report.checkpoint.id;
    assert!(
        id > orphan && id != orphan,
        "the new id {id} is the dead process's {orphan} or below it"
    );
    assert_eq!(report.checkpoint.input_offsets, offsets(2));
    // The dead process's checkpoint dir (older than the committed id) is gone.
    let cps = dir.with_file_name("counts.checkpoints");
    assert!(!cps.join(orphan.to_string()).exists());
    // And what was committed restores with both keys.
    let back = tmp.path().join("back");
    restore(&store, &Checkpoint::V2(report.checkpoint.clone()), &back)
        .await
        .unwrap();
    drop(db);
    let reopened = RocksStore::open("counts", &back).unwrap();
    assert_eq!(
        reopened.db().get(b"k2").unwrap().as_deref(),
        Some(&b"v2"[..])
    );
}

/// A blob key that already exists is another writer's (or an orphan a sweep may be deleting):
/// the upload never reuses it — the commit is abandoned, and the next commit (a new id) goes
/// through without it. Before, a key holding the same bytes was taken as "ours" and reused.
#[tokio::test]
async fn an_existing_blob_key_abandons_the_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let store: Arc<dyn BlobStore> = Arc::new(LocalStore::new(tmp.path().join("store")).unwrap());
    let dir = tmp.path().join("state/counts");
    std::fs::create_dir_all(&dir).unwrap();
    let content = b"the one file of this store".to_vec();
    std::fs::write(dir.join("000001.sst"), &content).unwrap();
    let t = 1_800_000_000_000;
    let clock = Arc::new(At(AtomicU64::new(t)));
    let (mgr, claim) = process(
        &store,
        &clock,
        Arc::new(Files { dir: dir.clone() }),
        2,
        None,
    )
    .await;
    // The id the first commit will make: the clock moved past the claim, so (now, epoch base)
    // with the claim's number (1) as the epoch.
    let claim_id = claim.unwrap().as_v2().unwrap().id;
    clock.0.store(t + 1000, Relaxed);
    let next_id = CheckpointId::new(t + 1000, blobsnap::checkpoint::EPOCH_STRIDE).unwrap();
    assert!(next_id > claim_id);
    let key = sscope()
        .key(&StoreScope::blob_id(next_id, Sha256::of(&content)))
        .unwrap();
    store
        .put(
            &key,
            PutBody::Bytes(content.clone().into()),
            PutOptions::default(),
        )
        .await
        .unwrap();
    let e = mgr
        .commit(offsets(1))
        .await
        .expect_err("an upload onto an existing blob key commits");
    assert_eq!(e.kind(), ErrorKind::Transient, "{e}");
    assert!(e.to_string().contains("already exists"), "{e}");
    // Nothing was committed at that id; the next commit (a new id) is fine.
    let r = mgr.commit(offsets(1)).await.unwrap();
    assert!(r.checkpoint.id > next_id);
    let back = tmp.path().join("back");
    restore(&store, &Checkpoint::V2(r.checkpoint.clone()), &back)
        .await
        .unwrap();
    assert_eq!(std::fs::read(back.join("000001.sst")).unwrap(), content);
}

/// A store that, when armed, stores the next checkpoint document and then reports the call as
/// failed (`Transient`): a write that landed while its response was lost and the retry budget
/// ran out.
#[derive(Debug)]
struct LoseCheckpointResponse {
    inner: LocalStore,
    armed: AtomicBool,
    /// While set, every blob PUT fails (`Transient`): an outage.
    blobs_fail: AtomicBool,
}

impl fmt::Display for LoseCheckpointResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.inner, f)
    }
}

#[async_trait]
impl BlobStore for LoseCheckpointResponse {
    async fn capabilities(
        &self,
        probe: blobsnap::blobstore::Probe,
    ) -> blobsnap::Result<blobsnap::blobstore::Capabilities> {
        self.inner.capabilities(probe).await
    }
    async fn put(
        &self,
        key: &blobsnap::blobstore::BlobKey,
        body: PutBody,
        opts: PutOptions,
    ) -> Result<PutResult> {
        if key.as_str().contains("/blobs/") && self.blobs_fail.load(Relaxed) {
            return Err(Error::new(
                ErrorKind::Transient,
                format!("put {key}: 503 (outage)"),
            ));
        }
        let r = self.inner.put(key, body, opts).await?;
        if key.as_str().contains("/checkpoints/") && self.armed.swap(false, Relaxed) {
            return Err(Error::new(
                ErrorKind::Transient,
                format!("put {key}: gave up after 3 attempts (response lost)"),
            ));
        }
        Ok(r)
    }
    async fn get(
        &self,
        key: &blobsnap::blobstore::BlobKey,
        range: Option<Range<u64>>,
    ) -> Result<GetResult> {
        self.inner.get(key, range).await
    }
    async fn head(&self, key: &blobsnap::blobstore::BlobKey) -> Result<ObjectMeta> {
        self.inner.head(key).await
    }
    async fn delete_many(&self, keys: &[blobsnap::blobstore::BlobKey]) -> Result<DeleteFailures> {
        self.inner.delete_many(keys).await
    }
    fn list<'a>(&'a self, scope: &Scope) -> BoxStream<'a, Result<ObjectMeta>> {
        self.inner.list(scope)
    }
    async fn incomplete_uploads(
        &self,
        scope: &Scope,
        before: Option<std::time::SystemTime>,
    ) -> blobsnap::blobstore::Uploads {
        self.inner.incomplete_uploads(scope, before).await
    }
}

/// A checkpoint write that landed but whose call failed: the next commit of the same writer
/// finds its own document at that number, adopts it, and commits after it. Before, the next
/// commit's write hit the taken number and the task fenced itself off (`Conflict`).
#[tokio::test]
async fn a_checkpoint_write_that_landed_unacknowledged_is_adopted_not_fenced() {
    let tmp = tempfile::tempdir().unwrap();
    let lossy = Arc::new(LoseCheckpointResponse {
        inner: LocalStore::new(tmp.path().join("store")).unwrap(),
        armed: AtomicBool::new(false),
        blobs_fail: AtomicBool::new(false),
    });
    let store: Arc<dyn BlobStore> = lossy.clone();
    let dir = tmp.path().join("state/counts");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("000001.sst"), b"one").unwrap();
    let clock = Arc::new(At(AtomicU64::new(1_800_000_000_000)));
    let (mgr, _) = process(
        &store,
        &clock,
        Arc::new(Files { dir: dir.clone() }),
        3,
        None,
    )
    .await;
    let first = mgr.commit(offsets(10)).await.unwrap();

    std::fs::write(dir.join("000002.sst"), b"two").unwrap();
    lossy.armed.store(true, Relaxed);
    let e = mgr
        .commit(offsets(20))
        .await
        .expect_err("the lost response is reported");
    assert_eq!(e.kind(), ErrorKind::Transient, "{e}");

    std::fs::write(dir.join("000003.sst"), b"three").unwrap();
    let third = mgr
        .commit(offsets(30))
        .await
        .expect("the next commit of the same writer goes through");
    assert_eq!(third.seq, first.seq + 2, "committed after the adopted one");

    let cps = BlobCheckpointStore::new(Arc::clone(&store), JobScope::new("proto", "1").unwrap());
    let history = cps.history("Partition 0", usize::MAX).await.unwrap();
    let seen: Vec<(u64, String)> = history
        .iter()
        .map(|c| {
            (
                c.seq,
                c.checkpoint.offsets()[&Ssp::new("files", "lines", 0)].clone(),
            )
        })
        .collect();
    assert_eq!(
        &seen[..3],
        &[
            (first.seq + 2, "30".to_string()),
            (first.seq + 1, "20".to_string()),
            (first.seq, "10".to_string())
        ]
    );
    // Both the adopted and the new checkpoint restore, with their own files.
    for (c, files) in [(&history[1], 2), (&history[0], 3)] {
        let back = tmp.path().join(format!("back-{}", c.seq));
        restore(&store, &c.checkpoint, &back).await.unwrap();
        assert_eq!(std::fs::read_dir(&back).unwrap().count(), files + 1); // + RESTORED
    }
}

/// After a restore fallback the next commit builds on the checkpoint restored. The shape
/// (retention 3): C1 holds content s in file `a`; C2 drops `a`; C3 adds `a` back with s, so
/// C3 uploads s under its own key. C3's copy of s is corrupted and C2's index deleted: the
/// restart falls back to C1. Before, the startup cleanup made the unrestorable C3 the diff
/// base, the next commit reused C3's corrupt blob for `a`, and that commit did not restore.
#[tokio::test]
async fn after_a_fallback_the_next_commit_builds_on_the_checkpoint_restored() {
    use blobsnap::blobstore::get_bytes;
    let tmp = tempfile::tempdir().unwrap();
    let store: Arc<dyn BlobStore> = Arc::new(LocalStore::new(tmp.path().join("store")).unwrap());
    let dir = tmp.path().join("state/counts");
    std::fs::create_dir_all(&dir).unwrap();
    let s: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    let clock = Arc::new(At(AtomicU64::new(1_800_000_000_000)));
    let tick = |c: &Arc<At>| c.0.fetch_add(1000, Relaxed);

    let (mgr, _) = process(
        &store,
        &clock,
        Arc::new(Files { dir: dir.clone() }),
        3,
        None,
    )
    .await;
    std::fs::write(dir.join("a"), &s).unwrap();
    std::fs::write(dir.join("x1"), b"x1").unwrap();
    tick(&clock);
    let c1 = mgr.commit(offsets(1)).await.unwrap().checkpoint;
    std::fs::remove_file(dir.join("a")).unwrap();
    std::fs::write(dir.join("x2"), b"x2").unwrap();
    tick(&clock);
    let c2 = mgr.commit(offsets(2)).await.unwrap().checkpoint;
    std::fs::write(dir.join("a"), &s).unwrap();
    tick(&clock);
    let c3 = mgr.commit(offsets(3)).await.unwrap().checkpoint;
    drop(mgr);

    // C3 uploaded s under its own key (its base C2 lacked it); corrupt that copy, and delete
    // C2's index.
    let sscope = sscope();
    let c3_key = sscope
        .key(&StoreScope::blob_id(c3.id, Sha256::of(&s)))
        .unwrap();
    let mut bad = get_bytes(store.as_ref(), &c3_key, 1 << 20)
        .await
        .expect("C3 uploaded s under its own key")
        .to_vec();
    bad[100] ^= 0x5a;
    store
        .put(&c3_key, PutBody::Bytes(bad.into()), PutOptions::default())
        .await
        .unwrap();
    let c2_index = sscope.key(&marker(&c2)).unwrap();
    assert!(store.delete_many(&[c2_index]).await.unwrap().is_empty());

    // The restart: a new host (empty local dir). C3 does not restore (corrupt), nor C2 (no
    // index); C1 does — what the runtime's restore fallback does, step by step.
    std::fs::remove_dir_all(tmp.path().join("state")).unwrap();
    let e = restore(
        &store,
        &Checkpoint::V2(c3.clone()),
        &tmp.path().join("try3"),
    )
    .await
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
    let e = restore(
        &store,
        &Checkpoint::V2(c2.clone()),
        &tmp.path().join("try2"),
    )
    .await
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    restore(&store, &Checkpoint::V2(c1.clone()), &dir)
        .await
        .unwrap();
    std::fs::remove_file(dir.join("RESTORED")).ok();
    assert_eq!(std::fs::read(dir.join("a")).unwrap(), s);

    let (mgr, claim) = process(
        &store,
        &clock,
        Arc::new(Files { dir: dir.clone() }),
        3,
        Some(Checkpoint::V2(c1.clone())),
    )
    .await;
    assert_eq!(
        claim.unwrap().as_v2().unwrap().id,
        c3.id,
        "the claim is C3's"
    );
    tick(&clock);
    let y = mgr.commit(offsets(1)).await.unwrap().checkpoint;

    // The commit after the fallback restores, and `a` holds s.
    let back = tmp.path().join("back");
    restore(&store, &Checkpoint::V2(y.clone()), &back)
        .await
        .expect("the first commit after a fallback restores");
    assert_eq!(std::fs::read(back.join("a")).unwrap(), s);
}

/// A disk that fills up under a commit (real RocksDB on a real 16 MiB tmpfs, filled by
/// another writer between writes and the commit): the commit fails with an I/O error naming
/// the full disk and leaves no checkpoint dir for its id; the last committed checkpoint is
/// still the latest and restores; a restart with the space back commits the new writes.
#[tokio::test]
async fn a_full_disk_during_a_commit_loses_nothing_committed() {
    let tmp = tempfile::tempdir().unwrap();
    let store: Arc<dyn BlobStore> = Arc::new(LocalStore::new(tmp.path().join("store")).unwrap());
    let disk = support::SmallDisk::mount(16 << 20);
    let dir = disk.path.join("state/counts");
    let clock = Arc::new(At(AtomicU64::new(1_800_000_000_000)));
    let tick = |c: &At| c.0.fetch_add(1000, Relaxed);

    let db = Arc::new(RocksStore::open("counts", &dir).unwrap());
    db.db().put(b"k1", b"v1").unwrap();
    let (first, _) = process(&store, &clock, db.clone(), 2, None).await;
    let c1 = first.commit(offsets(1)).await.unwrap().checkpoint;
    tick(&clock);

    db.db().put(b"k2", vec![7u8; 256 << 10]).unwrap();
    let filler = disk.fill("filler");
    let e = first
        .commit(offsets(2))
        .await
        .expect_err("a commit on a full disk fails");
    eprintln!("commit on a full disk: {e}");
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(e.to_string().contains("No space left"), "{e}");
    let cps = dir.with_file_name("counts.checkpoints");
    let left: Vec<_> = std::fs::read_dir(&cps)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        left.iter()
            .all(|n| n.to_string_lossy() == c1.id.to_string()),
        "no checkpoint dir of the failed commit: {left:?}"
    );
    drop(first);
    let checkpoints =
        BlobCheckpointStore::new(Arc::clone(&store), JobScope::new("proto", "1").unwrap());
    let latest = checkpoints.latest("Partition 0").await.unwrap().unwrap();
    assert_eq!(latest.checkpoint.as_v2().unwrap().id, c1.id);
    let back = tmp.path().join("back1");
    restore(&store, &Checkpoint::V2(c1.clone()), &back)
        .await
        .unwrap();
    {
        let r = RocksStore::open("counts", &back).unwrap();
        assert_eq!(r.db().get(b"k1").unwrap().as_deref(), Some(&b"v1"[..]));
    }

    // The space comes back; the task restarts (a new process, the database reopened).
    std::fs::remove_file(&filler).unwrap();
    drop(db);
    let db = Arc::new(RocksStore::open("counts", &dir).unwrap());
    tick(&clock);
    let (next, _) = process(&store, &clock, db.clone(), 2, None).await;
    let c2 = next.commit(offsets(2)).await.unwrap().checkpoint;
    assert!(c2.id > c1.id);
    let back = tmp.path().join("back2");
    restore(&store, &Checkpoint::V2(c2), &back).await.unwrap();
    let r = RocksStore::open("counts", &back).unwrap();
    assert_eq!(r.db().get(b"k2").unwrap().map(|v| v.len()), Some(256 << 10));
}

/// Checkpoint dirs do not pile up through an outage (N12 of the second protocol review): 5
/// commits whose uploads fail leave at most the committed checkpoint's dir and the last
/// attempt's (each failed attempt's dir, hard links pinning SSTs the store may have deleted,
/// went at the next attempt), and a leftover `.tmp` of a cut-short checkpoint goes too; once
/// the store answers, the commit lands and only its dir remains.
#[tokio::test]
async fn failed_commits_leave_no_pile_of_checkpoint_dirs() {
    let tmp = tempfile::tempdir().unwrap();
    let flaky = Arc::new(LoseCheckpointResponse {
        inner: LocalStore::new(tmp.path().join("store")).unwrap(),
        armed: AtomicBool::new(false),
        blobs_fail: AtomicBool::new(false),
    });
    let store: Arc<dyn BlobStore> = flaky.clone();
    let dir = tmp.path().join("state/counts");
    std::fs::create_dir_all(&dir).unwrap();
    let clock = Arc::new(At(AtomicU64::new(1_800_000_000_000)));
    let engine: Arc<dyn StoreEngine> = Arc::new(Files { dir: dir.clone() });
    let (mgr, _) = process(&store, &clock, Arc::clone(&engine), 2, None).await;
    std::fs::write(dir.join("000001.sst"), b"first").unwrap();
    mgr.commit(offsets(1)).await.unwrap();
    let cps_dir = StoreSpec {
        name: "counts".into(),
        dir: dir.clone(),
    }
    .checkpoints_dir();
    let count = || std::fs::read_dir(&cps_dir).unwrap().count();
    assert_eq!(count(), 1);
    std::fs::create_dir(cps_dir.join("1800000000000-0.tmp")).unwrap();
    flaky.blobs_fail.store(true, Relaxed);
    for i in 2..7u64 {
        clock.0.fetch_add(1_000, Relaxed);
        std::fs::write(dir.join(format!("{i:06}.sst")), format!("sst {i}")).unwrap();
        let e = mgr.commit(offsets(i)).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Transient, "{e}");
        assert!(count() <= 2, "after failed commit {i}: {} dirs", count());
    }
    assert!(!cps_dir.join("1800000000000-0.tmp").exists());
    flaky.blobs_fail.store(false, Relaxed);
    clock.0.fetch_add(1_000, Relaxed);
    mgr.commit(offsets(7)).await.unwrap();
    assert_eq!(count(), 1, "only the committed checkpoint's dir");
}

/// Retention settings that must agree (issue 46, S4-5): a history that retains more
/// checkpoints than the blob backend's window, or keeps tiers the backend does not read,
/// would have the backend delete the snapshots of retained checkpoints. The commit manager
/// refuses the first commit (`InvalidInput`, naming both settings) before anything is
/// written or deleted; agreeing settings commit.
#[tokio::test]
async fn a_backend_window_smaller_than_the_history_is_refused_before_any_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let store: Arc<dyn BlobStore> = Arc::new(LocalStore::new(tmp.path().join("store")).unwrap());
    let dir = tmp.path().join("state/counts");
    let clock = Arc::new(At(AtomicU64::new(1_800_000_000_000)));
    let db = Arc::new(RocksStore::open("counts", &dir).unwrap());
    db.db().put(b"k", b"v").unwrap();
    let tiers: Vec<blobsnap::retention::Tier> = "last 2, every 1h for 1d"
        .parse::<blobsnap::retention::RetentionPolicy>()
        .unwrap()
        .tiers;
    for (history, window, tiered, with_tiers, ok) in [
        (5, 2, false, false, false),
        (2, 2, false, true, false),
        (5, 5, false, false, true),
        (2, 2, true, true, true),
    ] {
        let checkpoints: Arc<dyn CheckpointStore> = Arc::new(BlobCheckpointStore::new(
            Arc::clone(&store),
            JobScope::new("proto", "1").unwrap(),
        ));
        let vclock: Arc<dyn Clock> = clock.clone();
        let (mgr, claim) = TaskCommitManager::start(
            ctx(),
            Arc::clone(&checkpoints),
            Arc::clone(&vclock),
            history,
            false,
        )
        .await
        .unwrap();
        let mgr = if with_tiers {
            mgr.with_retention_tiers(tiers.clone())
        } else {
            mgr
        };
        let settings = BackupSettings {
            retention: window,
            tiered_retention: tiered,
            hash_cache: false,
            ..Default::default()
        };
        let mgr = attach(mgr, &store, vclock, db.clone(), settings, claim).await;
        let before = checkpoints.latest_seq(&ctx().task_name).await.unwrap();
        let r = mgr.commit(offsets(1)).await;
        if ok {
            r.unwrap();
        } else {
            let e = r.expect_err("a mismatched retention is refused");
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
            assert!(
                e.to_string().contains("BackupSettings::"),
                "names the setting: {e}"
            );
            assert_eq!(
                checkpoints.latest_seq(&ctx().task_name).await.unwrap(),
                before,
                "nothing committed"
            );
        }
    }
}

/// A checkpoint store whose next history trim (of either kind) fails once it is armed.
#[derive(Debug)]
struct FlakyTrim {
    inner: BlobCheckpointStore,
    armed: AtomicBool,
}

impl FlakyTrim {
    fn fail(&self) -> Result<()> {
        if self.armed.swap(false, Relaxed) {
            return Err(Error::new(
                ErrorKind::Transient,
                "injected: the trim failed",
            ));
        }
        Ok(())
    }
}

#[async_trait]
impl CheckpointStore for FlakyTrim {
    async fn enforces_exclusive_writes(&self) -> Result<bool> {
        self.inner.enforces_exclusive_writes().await
    }
    async fn latest(
        &self,
        task: &str,
    ) -> Result<Option<blobsnap::checkpoint::CommittedCheckpoint>> {
        self.inner.latest(task).await
    }
    async fn latest_seq(&self, task: &str) -> Result<Option<u64>> {
        self.inner.latest_seq(task).await
    }
    async fn history(
        &self,
        task: &str,
        limit: usize,
    ) -> Result<Vec<blobsnap::checkpoint::CommittedCheckpoint>> {
        self.inner.history(task, limit).await
    }
    async fn write(&self, task: &str, seq: u64, writer: &str, c: &Checkpoint) -> Result<()> {
        self.inner.write(task, seq, writer, c).await
    }
    async fn trim(&self, task: &str, keep: usize) -> Result<()> {
        self.fail()?;
        self.inner.trim(task, keep).await
    }
    async fn delete_seqs(&self, task: &str, seqs: &[u64]) -> Result<()> {
        self.fail()?;
        self.inner.delete_seqs(task, seqs).await
    }
    async fn delete_seqs_and(
        &self,
        task: &str,
        seqs: &[u64],
        also: &[blobsnap::blobstore::DeferredDeletes],
    ) -> Result<()> {
        self.fail()?;
        self.inner.delete_seqs_and(task, seqs, also).await
    }
}

/// F9 of the protocol reviews: a failed trim of the history never costs a retained
/// checkpoint its blobs. The commit whose cleanup's trim fails is still committed; the keys
/// its cleanup handed over wait for a trim that lands (the next commit's), and after it every
/// checkpoint the history retains restores, and the history is back to its retention.
#[tokio::test]
async fn a_failed_trim_keeps_every_retained_checkpoint_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let store: Arc<dyn BlobStore> = Arc::new(LocalStore::new(tmp.path().join("store")).unwrap());
    let dir = tmp.path().join("state/counts");
    let clock = Arc::new(At(AtomicU64::new(1_800_000_000_000)));
    let db = Arc::new(RocksStore::open("counts", &dir).unwrap());
    let checkpoints = Arc::new(FlakyTrim {
        inner: BlobCheckpointStore::new(Arc::clone(&store), JobScope::new("proto", "1").unwrap()),
        armed: AtomicBool::new(false),
    });
    let vclock: Arc<dyn Clock> = clock.clone();
    let (mgr, claim) = TaskCommitManager::start(
        ctx(),
        Arc::clone(&checkpoints) as Arc<dyn CheckpointStore>,
        Arc::clone(&vclock),
        2,
        false,
    )
    .await
    .unwrap();
    let settings = BackupSettings {
        retention: 2,
        hash_cache: false,
        inline_below: 0,
        ..Default::default()
    };
    let mgr = attach(mgr, &store, vclock, db.clone(), settings, claim).await;
    for i in 1..=6u64 {
        // Every commit a new table and one compacted away: each snapshot has blobs of its own.
        db.db().put(format!("k{i}"), vec![i as u8; 5000]).unwrap();
        db.flush().unwrap();
        db.db().compact_range::<&[u8], &[u8]>(None, None);
        if i == 3 {
            checkpoints.armed.store(true, Relaxed);
        }
        clock.0.fetch_add(1000, Relaxed);
        mgr.commit(offsets(i)).await.unwrap_or_else(|e| {
            panic!("commit {i}: a failed trim never fails the commit point: {e}")
        });
        assert!(
            !checkpoints.armed.load(Relaxed) || i < 3,
            "the trim was tried"
        );
        for c in checkpoints
            .history(&ctx().task_name, usize::MAX)
            .await
            .unwrap()
        {
            let back = tmp.path().join(format!("back-{i}-{}", c.seq));
            restore(&store, &c.checkpoint, &back)
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "after commit {i}: retained checkpoint #{} does not restore: {e}",
                        c.seq
                    )
                });
        }
    }
    let ids: std::collections::BTreeSet<_> = checkpoints
        .history(&ctx().task_name, usize::MAX)
        .await
        .unwrap()
        .iter()
        .filter_map(|c| c.checkpoint.as_v2().map(|v| v.id))
        .collect();
    assert_eq!(
        ids.len(),
        2,
        "the history is back to its retention: {ids:?}"
    );
}

/// While a store of the task is still lazily restoring, nothing leaves retention (DESIGN §8;
/// issue 46, item 8): a blob found corrupt at its late fetch must leave the restore fallback
/// the checkpoints the task had. With one file of the store remote (its fetch never ends;
/// RocksDB never opens it), four commits at retention 2 keep every earlier checkpoint in the
/// history and restorable; once the store is complete, the next commits trim back to two and
/// every retained checkpoint still restores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_leaves_retention_while_a_store_hydrates() {
    use blobsnap::index::{FileBlob, FileIndex, FileMetadata};
    let tmp = tempfile::tempdir().unwrap();
    let store: Arc<dyn BlobStore> = Arc::new(LocalStore::new(tmp.path().join("store")).unwrap());
    let dir = tmp.path().join("state/counts");
    let clock = Arc::new(At(AtomicU64::new(1_800_000_000_000)));
    let db = Arc::new(RocksStore::open("counts", &dir).unwrap());
    let (mgr, _) = process(&store, &clock, db.clone(), 2, None).await;
    let cps = BlobCheckpointStore::new(Arc::clone(&store), JobScope::new("proto", "1").unwrap());
    let commit = |i: u64| {
        let (db, mgr, clock, cps, store, tmp) = (&db, &mgr, &clock, &cps, &store, &tmp);
        async move {
            // A new table and one compacted away: each snapshot has blobs of its own.
            db.db().put(format!("k{i}"), vec![i as u8; 5000]).unwrap();
            db.flush().unwrap();
            db.db().compact_range::<&[u8], &[u8]>(None, None);
            clock.0.fetch_add(1000, Relaxed);
            mgr.commit(offsets(i)).await.unwrap();
            let history = cps.history(&ctx().task_name, usize::MAX).await.unwrap();
            for c in &history {
                let back = tmp.path().join(format!("back-{i}-{}", c.seq));
                restore(store, &c.checkpoint, &back)
                    .await
                    .unwrap_or_else(|e| {
                        panic!(
                            "after commit {i}: retained #{} does not restore: {e}",
                            c.seq
                        )
                    });
            }
            history.iter().map(|c| c.seq).collect::<Vec<u64>>()
        }
    };
    for i in 1..=3 {
        commit(i).await;
    }
    let before = commit(4).await;
    assert_eq!(before.len(), 2, "{before:?}");

    // The store restores lazily: one file is still remote, its fetch never ends.
    let remote = FileIndex {
        file_name: "000999.sst".into(),
        blobs: vec![FileBlob {
            blob_id: "never".into(),
            offset: 0,
        }],
        file_metadata: FileMetadata {
            creation_time_millis: 0,
            last_modified_time_millis: 0,
            size: 4096,
            owner: String::new(),
            group: String::new(),
            permissions: "rw-r--r--".into(),
        },
        checksum: 0,
        sha256: None,
        inline_data: None,
        heat: None,
    };
    blobsnap::local::lazy::register(
        &dir,
        vec![remote],
        Arc::new(|_, _| Box::pin(futures::future::pending())),
        None,
        blobsnap::local::lazy::Background {
            downloads: 1,
            max_rate: 0,
        },
    )
    .unwrap();
    assert!(blobsnap::local::lazy::status(&dir).is_some());
    let mut during = Vec::new();
    for i in 5..=8 {
        during = commit(i).await;
        for s in &before {
            assert!(
                during.contains(s),
                "commit {i} while hydrating let #{s} go: {during:?}"
            );
        }
    }
    assert_eq!(during.len(), before.len() + 4, "{during:?}");

    // Complete (the registration ends): the next commits trim back to the retention.
    blobsnap::local::lazy::close(&dir);
    assert!(blobsnap::local::lazy::status(&dir).is_none());
    let mut after = Vec::new();
    for i in 9..=11 {
        after = commit(i).await;
    }
    assert_eq!(after.len(), 2, "back to the retention: {after:?}");
    assert!(before.iter().all(|s| !after.contains(s)), "{after:?}");
}

/// A checkpoint made elsewhere (a Samza job's, through the JNI plug-in's checkpoint manager):
/// `commit_made` writes it create-only under the next number — a zombie of the task that
/// claimed it earlier loses with `Conflict` and writes nothing — accepts an id older than the
/// last (Samza mints ids from its own clock), and trims the history to the retention.
#[tokio::test]
async fn a_checkpoint_made_elsewhere_is_committed_fenced_and_trimmed() {
    let tmp = tempfile::tempdir().unwrap();
    let store: Arc<dyn BlobStore> = Arc::new(LocalStore::new(tmp.path().join("s")).unwrap());
    let cps: Arc<dyn CheckpointStore> = Arc::new(BlobCheckpointStore::new(
        Arc::clone(&store),
        JobScope::new("proto", "1").unwrap(),
    ));
    let clock = Arc::new(At(AtomicU64::new(1_000)));
    let made = |millis: u64, offset: u64| CheckpointV2 {
        id: CheckpointId::new(millis, 42).unwrap(),
        input_offsets: offsets(offset),
        state_checkpoint_markers: BTreeMap::from([(
            "blobsnap.BlobStoreStateBackendFactory".to_string(),
            BTreeMap::from([("counts".to_string(), format!("index/{millis}-42.x.json"))]),
        )]),
    };
    let (zombie, _) = TaskCommitManager::start(ctx(), Arc::clone(&cps), clock.clone(), 2, false)
        .await
        .unwrap();
    zombie.commit_made(made(5_000, 10)).await.unwrap();
    // A new container of the task claims it; the old one's next write loses, and writes nothing.
    let (newer, last) = TaskCommitManager::start(ctx(), Arc::clone(&cps), clock.clone(), 2, false)
        .await
        .unwrap();
    assert_eq!(last.unwrap().as_v2().unwrap().input_offsets, offsets(10));
    let e = zombie.commit_made(made(6_000, 20)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
    // Ids that do not increase are committed as they come.
    newer.commit_made(made(9_000, 30)).await.unwrap();
    let r = newer.commit_made(made(7_000, 40)).await.unwrap();
    let latest = cps.latest("Partition 0").await.unwrap().unwrap();
    assert_eq!(latest.seq, r.seq);
    assert_eq!(
        latest.checkpoint.as_v2().unwrap().input_offsets,
        offsets(40),
        "the latest is the last written, whatever its id"
    );
    // Retention 2: the history holds the newest two ids (the zombie's lost write is nowhere).
    let history = cps.history("Partition 0", 100).await.unwrap();
    let ids: Vec<String> = history
        .iter()
        .map(|c| c.checkpoint.as_v2().unwrap().id.to_string())
        .collect();
    assert_eq!(ids, ["7000-42", "9000-42"], "{history:?}");
}
