//! `blobsnap backup`: a manual backup of a closed RocksDB directory.

use std::path::PathBuf;
use std::sync::Arc;

use super::args::{open_store, user_cache_dir, StoreArgs};
use super::progress::Bar;
use blobsnap::backend::{StoreSpec, TaskContext};
use blobsnap::blob::FACTORY_NAME;
use blobsnap::checkpoint::{Checkpoint, CheckpointV2};
use blobsnap::{Error, ErrorKind};
use clap::Args;

#[derive(Args)]
pub(crate) struct BackupArgs {
    /// The RocksDB directory (closed), or a RocksDB checkpoint directory.
    #[arg(long)]
    pub(crate) db: PathBuf,
    /// The backup's name.
    #[arg(long)]
    pub(crate) name: String,
}

pub(crate) async fn run(
    store_args: &StoreArgs,
    json: bool,
    args: BackupArgs,
) -> blobsnap::Result<()> {
    let BackupArgs { db, name } = args;
    backup_command(store_args, json, &db, &name).await?;
    Ok(())
}

/// `blobsnap backup`: manual backups are a job named `manual` whose id is the backup's name,
/// with one task (`backup`) and one store (`db`), so the layout, restore and the sweep apply
/// unchanged.
pub(crate) async fn backup_command(
    args: &StoreArgs,
    json: bool,
    db_dir: &std::path::Path,
    name: &str,
) -> blobsnap::Result<()> {
    use blobsnap::backend::TaskBackupManager as _;
    use blobsnap::checkpoint::{BlobCheckpointStore, CheckpointStore as _};
    let blob_store = open_store(args).await?;
    if !db_dir.join("CURRENT").is_file() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "{} is not a RocksDB directory (no CURRENT file)",
                db_dir.display()
            ),
        ));
    }
    let task = TaskContext {
        job_name: "manual".into(),
        job_id: name.to_string(),
        task_name: "backup".into(),
    };
    let job = blobsnap::layout::JobScope::new("manual", name)?;
    let pins = BlobCheckpointStore::new(Arc::clone(&blob_store), job);
    let last = pins.latest("backup").await?;
    // A database dir (it has a LOCK file) is backed up as it is, never opened: opening it with
    // this RocksDB would replay its WAL, flush, and write a new MANIFEST and OPTIONS in a
    // format the application's own (older) RocksDB may refuse. RocksDB's own lock is held for
    // the whole upload (a running process holds it: Conflict), and only the live files are
    // read (not LOCK, the info logs, obsolete MANIFESTs). A checkpoint dir (no LOCK) is
    // uploaded as it is.
    let closed = if db_dir.join("LOCK").exists() {
        Some(blobsnap::local::rocks::ClosedDb::lock(db_dir)?)
    } else {
        None
    };
    let only = closed.as_ref().map(|c| c.live_files()).transpose()?;
    let mut clock_ids = blobsnap::checkpoint::CheckpointIdGen::after(
        last.as_ref()
            .and_then(|c| c.checkpoint.as_v2())
            .map(|c| c.id),
    );
    let id = clock_ids.next(blobsnap::backend::Clock::now_millis(
        &blobsnap::backend::SystemClock,
    ))?;
    let dir = db_dir.to_path_buf();
    let spec = StoreSpec {
        name: "db".into(),
        dir: db_dir.to_path_buf(),
    };
    let mgr = blobsnap::blob::backup::BlobBackupManager::new(
        Arc::clone(&blob_store),
        task,
        std::slice::from_ref(&spec),
        Arc::new(blobsnap::backend::SystemClock),
        blobsnap::blob::backup::BackupSettings {
            // The hashes of the database's immutable files are cached in the user's cache
            // dir (never next to the database): an incremental backup reads only new files.
            hash_cache: true,
            hash_cache_dir: Some(user_cache_dir().join("hashcache")),
            only,
            ..Default::default()
        },
    )?;
    mgr.init(last.as_ref().map(|c| &c.checkpoint)).await?;
    let bar = mgr.progress("db").map(|p| {
        Bar::start("backup", move || {
            use std::sync::atomic::Ordering::Relaxed;
            (
                p.bytes_uploaded.load(Relaxed),
                p.bytes_to_upload.load(Relaxed),
            )
        })
    });
    let result = mgr
        .upload(
            id,
            &Default::default(),
            &[("db".to_string(), dir.clone())].into(),
        )
        .await;
    drop(bar);
    drop(closed);
    let markers = result?;
    let checkpoint = Checkpoint::V2(CheckpointV2 {
        id,
        input_offsets: Default::default(),
        state_checkpoint_markers: [(FACTORY_NAME.to_string(), markers.clone())].into(),
    });
    let seq = last.as_ref().map(|c| c.seq).unwrap_or(0) + 1;
    pins.write(
        "backup",
        seq,
        &format!("cli-{:016x}", rand::random::<u64>()),
        &checkpoint,
    )
    .await?;
    let marker = markers.get("db").cloned().unwrap_or_default();
    let s = mgr
        .last_upload_stats()
        .get("db")
        .copied()
        .unwrap_or_default();
    if json {
        println!(
            "{}",
            serde_json::json!({"schema": 1, "name": name, "marker": marker, "checkpoint-id": id.to_string(),
                "files": s.files, "bytes": s.bytes, "uploaded-files": s.blobs_uploaded, "uploaded-bytes": s.bytes_uploaded})
        );
    } else {
        println!("{marker}");
        eprintln!(
            "backup {name}: {} files, {} bytes; uploaded {} files, {} bytes. Restore with: blobsnap restore --name {name} --to DIR (this backup: add {marker})",
            s.files, s.bytes, s.blobs_uploaded, s.bytes_uploaded
        );
    }
    Ok(())
}
