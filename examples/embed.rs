//! blobsnap in a processing loop of your own: one task that counts words into RocksDB,
//! restores its store on start, commits every N records and cleans up — everything through
//! the state-backend SPI (`BlobStateBackendFactory`) and the commit manager
//! (`TaskCommitManager`), the way the bundled job runtime does it.
//!
//! ```sh
//! cargo run --example embed -- /tmp/embed 3000   # process 3,000 records, committing every 500
//! cargo run --example embed -- /tmp/embed 5000   # resumes from the last committed offset
//! ```
//!
//! State lives in `DIR/state`, the blob store in `DIR/store` (any store `Settings` can open:
//! set `BLOBSNAP_STORE=s3` and `BLOBSNAP_S3_*` for S3). Delete `DIR/state` to see a restore
//! from the blob store; the count of each word is then the same as if it had never been lost.

use std::collections::BTreeMap;
use std::sync::Arc;

use blobsnap::backend::{
    Clock, StateBackendFactory, StoreEngine, StoreSpec, SystemClock, TaskContext,
};
use blobsnap::blob::backup::BackupSettings;
use blobsnap::blob::factory::BlobStateBackendFactory;
use blobsnap::blob::restore::RestoreSettings;
use blobsnap::checkpoint::{BlobCheckpointStore, Ssp};
use blobsnap::commit::{Backend, TaskCommitManager};
use blobsnap::config::{Settings, StoreKind};
use blobsnap::layout::JobScope;
use blobsnap::local::rocks::RocksStore;
use blobsnap::{Error, ErrorKind, Result};

const COMMIT_EVERY: u64 = 500;

/// The input: record `n` of partition 0 (a real job reads Kafka or files).
fn record(n: u64) -> String {
    const WORDS: [&str; 7] = [
        "state", "blob", "commit", "restore", "task", "store", "sweep",
    ];
    format!(
        "{} {}",
        WORDS[(n % 7) as usize],
        WORDS[(n * 3 % 5) as usize]
    )
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().unwrap_or_else(|| "embed-demo".into()));
    let records: u64 = match args.next() {
        Some(n) => n.parse().map_err(|_| {
            Error::new(
                ErrorKind::InvalidInput,
                format!("records: {n:?} is not a number"),
            )
        })?,
        None => 3000,
    };

    // 1. The blob store, opened once per process (its one transfer budget is shared by every
    //    task), and the backend over it.
    let mut settings = Settings::load(None)?;
    if settings.store.kind == StoreKind::Local {
        settings.store.local_dir = dir.join("store");
    }
    let store = settings.open_store().await?;
    let backend: Arc<dyn StateBackendFactory> = Arc::new(BlobStateBackendFactory::new(
        Arc::clone(&store),
        None,
        BackupSettings::default(),
        RestoreSettings::default(),
        "example",
    ));
    let admin = backend.admin("embed", "1")?;
    admin.create_resources().await?;
    admin.validate_resources().await?;

    // 2. Claim the task: its last checkpoint, and a fence against any older writer.
    let task = TaskContext {
        job_name: "embed".into(),
        job_id: "1".into(),
        task_name: "Partition 0".into(),
    };
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let checkpoints = Arc::new(BlobCheckpointStore::new(
        Arc::clone(&store),
        JobScope::new(&task.job_name, &task.job_id)?,
    ));
    let (commits, last) =
        TaskCommitManager::start(task.clone(), checkpoints, Arc::clone(&clock), 2, false).await?;

    // 3. Restore the store from that checkpoint (only what is not on local disk is fetched),
    //    then open it.
    let spec = StoreSpec {
        name: "counts".into(),
        dir: dir.join("state/counts"),
    };
    let specs = [spec.clone()];
    let restorer = backend.restore_manager(&task, &specs, Arc::clone(&clock))?;
    restorer.init(last.as_ref()).await?;
    restorer.restore().await?;
    let db = Arc::new(RocksStore::open(&spec.name, &spec.dir)?);

    // 4. The backup side, based on the same checkpoint, and the commit manager over both.
    let backup = backend.backup_manager(&task, &specs, clock)?;
    backup.init(last.as_ref()).await?;
    let commits = commits
        .with_stores(vec![Arc::clone(&db) as Arc<dyn StoreEngine>])
        .with_backends(
            vec![Backend {
                name: backend.name().into(),
                manager: Arc::clone(&backup),
            }],
            last.clone(),
        );

    // 5. Resume from the committed input offset, process, commit every COMMIT_EVERY records.
    let ssp = Ssp::new("example", "records", 0);
    let mut offset: u64 = match last.as_ref().and_then(|c| c.offsets().get(&ssp)) {
        Some(o) => o.parse().map_err(|_| {
            Error::new(
                ErrorKind::Corrupt,
                format!("offset {o:?} of {ssp:?} is not a number"),
            )
        })?,
        None => 0,
    };
    println!("resuming from offset {offset}");
    let rocks = |e: rocksdb::Error| Error::new(ErrorKind::Io, format!("rocksdb: {e}"));
    while offset < records {
        for word in record(offset).split_whitespace() {
            let n = match db.db().get(word).map_err(rocks)? {
                Some(v) => u64::from_le_bytes(v.as_slice().try_into().unwrap_or([0; 8])),
                None => 0,
            };
            db.db().put(word, (n + 1).to_le_bytes()).map_err(rocks)?;
        }
        offset += 1;
        if offset.is_multiple_of(COMMIT_EVERY) || offset == records {
            let report = commits
                .commit(BTreeMap::from([(ssp.clone(), offset.to_string())]))
                .await?;
            let up = backup.last_upload();
            let s = up.get("counts").copied().unwrap_or_default();
            println!(
                "committed {} at offset {offset}: {} of {} files uploaded ({} bytes)",
                report.checkpoint.id, s.files_uploaded, s.files, s.bytes_uploaded
            );
        }
    }
    backup.close().await?;
    let mut total = 0;
    for item in db.db().iterator(rocksdb::IteratorMode::Start) {
        let (_, v) = item.map_err(rocks)?;
        total += u64::from_le_bytes(v.as_ref().try_into().unwrap_or([0; 8]));
    }
    println!("done at offset {offset}: {total} words counted");
    Ok(())
}
