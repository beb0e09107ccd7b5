//! The demo job: word count over generated text partitions.
//!
//! Each task counts the words of its partition in a RocksDB store (`word → u64` little
//! endian). The input is generated once, deterministically, under `<dir>/input`; the state,
//! the local blob store (unless S3 is given) and everything else live under `<dir>`, so a run
//! is deleted with that directory. Killed at any moment and started again, the job resumes
//! from its last checkpoint, and the final counts equal an independent count of the input.

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;

use super::{
    run_task, store_dir, task_name, CommitObserver, JobSettings, Message, Processor, Stores,
    TaskSummary,
};
use crate::backend::{Clock, StateBackendAdmin, StateBackendFactory};
use crate::blob::commit::backup::BackupSettings;
use crate::blob::factory::BlobStateBackendFactory;
use crate::blob::restore::RestoreSettings;
use crate::blobstore::BlobStore;
use crate::error::{Error, Result};
use crate::local::rocks::RocksStore;

/// Counts words.
#[derive(Debug, Default)]
pub struct WordCount;

impl Processor for WordCount {
    /// Counts words in `counts`; if the job also has a `lengths` store, counts word lengths
    /// there.
    fn process(&self, stores: &Stores, message: &Message) -> Result<()> {
        let db = stores
            .get("counts")
            .ok_or_else(|| Error::invalid("the word-count job needs a store named \"counts\""))?;
        if let Some(lengths) = stores.get("lengths") {
            let mut by_len: HashMap<String, u64> = HashMap::new();
            for w in message.line.split_whitespace() {
                *by_len.entry(format!("{:04}", w.len())).or_default() += 1;
            }
            // The first message a `lengths` store sees records where it starts counting (a
            // store added to a running job starts empty at the offset the task resumed from),
            // in the same batch as its counts: the independent check counts from there.
            let started = lengths
                .db()
                .get(LENGTHS_FROM_KEY.as_bytes())
                .map_err(|e| {
                    crate::local::rocks::rocks_error("read the lengths store's start", &e)
                })?
                .is_some();
            let this_offset = message
                .next_offset
                .saturating_sub(message.line.len() as u64 + 1);
            add_counts(
                lengths,
                by_len.iter().map(|(k, n)| (k.as_str(), *n)),
                (!started).then_some((LENGTHS_FROM_KEY, this_offset)),
            )?;
        }
        let mut local: HashMap<&str, u64> = HashMap::new();
        for w in message.line.split_whitespace() {
            *local.entry(w).or_default() += 1;
        }
        add_counts(db, local.into_iter(), None)
    }
}

/// The key of a `lengths` store that holds the input offset (u64 little endian) of the first
/// message it counted: [`check_lengths`] counts the input from there.
pub const LENGTHS_FROM_KEY: &str = "~counts-from";

/// Add `counts` to the u64 counters of `db` in one write batch, with `set` (a key and its
/// u64 value) put in the same batch.
fn add_counts<'a>(
    db: &RocksStore,
    counts: impl Iterator<Item = (&'a str, u64)>,
    set: Option<(&str, u64)>,
) -> Result<()> {
    let mut batch = rocksdb::WriteBatch::default();
    if let Some((k, v)) = set {
        batch.put(k.as_bytes(), v.to_le_bytes());
    }
    {
        for (w, n) in counts {
            let old = db
                .db()
                .get(w.as_bytes())
                .map_err(|e| crate::local::rocks::rocks_error(format!("read count of {w:?}"), &e))?
                .map(|v| decode(&v))
                .transpose()?
                .unwrap_or(0);
            batch.put(w.as_bytes(), (old + n).to_le_bytes());
        }
    }
    db.db()
        .write(batch)
        .map_err(|e| crate::local::rocks::rocks_error("write counts", &e))
}

fn decode(v: &[u8]) -> Result<u64> {
    let arr: [u8; 8] = v
        .try_into()
        .map_err(|_| Error::corrupt(format!("a count of {} bytes, expected 8", v.len())))?;
    Ok(u64::from_le_bytes(arr))
}

const WORDS: &[&str] = &[
    "the",
    "state",
    "of",
    "a",
    "stream",
    "job",
    "lives",
    "in",
    "rocksdb",
    "and",
    "every",
    "commit",
    "uploads",
    "only",
    "what",
    "changed",
    "to",
    "blob",
    "store",
    "checkpoint",
    "marker",
    "index",
    "restore",
    "reuses",
    "local",
    "bytes",
    "kafka",
    "samza",
    "partition",
    "offset",
    "task",
    "snapshot",
    "sst",
    "manifest",
    "garbage",
    "collection",
    "retention",
    "crash",
    "resume",
    "exactly",
    "counts",
    "words",
    "demo",
    "blobsnap",
    "s3",
    "bucket",
    "object",
    "key",
    "hash",
    "verify",
];

/// The parameters the input in `dir` was generated with by [`generate_input`]: partitions,
/// lines per partition, seed (`None`: no input there, or an unreadable stamp).
pub fn input_params(dir: &Path) -> Option<(u32, u64, u64)> {
    let text = std::fs::read_to_string(dir.join("PARAMS")).ok()?;
    let mut it = text.split_whitespace();
    let partitions = it.next()?.parse().ok()?;
    let lines = it.next()?.parse().ok()?;
    let seed = it.next()?.parse().ok()?;
    Some((partitions, lines, seed))
}

/// Write `partitions` input files of `lines` lines each under `dir` (once: an existing input
/// with the same parameters is kept, so a restarted run reads the same data). Each
/// partition's lines come from a generator seeded by `seed` and the partition alone: more
/// lines (or partitions) extend the same input.
pub fn generate_input(dir: &Path, partitions: u32, lines: u64, seed: u64) -> Result<()> {
    use rand::{Rng as _, SeedableRng as _};
    let stamp = dir.join("PARAMS");
    let params = format!("{partitions} {lines} {seed}\n");
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(params.as_str()) {
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    for p in 0..partitions {
        let path = dir.join(format!("{p}.txt"));
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (u64::from(p) << 32));
        let mut out = std::io::BufWriter::new(
            std::fs::File::create(&path)
                .map_err(|e| Error::io(format!("create {}", path.display()), e))?,
        );
        for _ in 0..lines {
            let n = rng.random_range(3..12);
            let line: Vec<&str> = (0..n)
                .map(|_| {
                    // Skewed: low indexes are much more frequent.
                    let r: f64 = rng.random();
                    WORDS[((r * r * r) * WORDS.len() as f64) as usize % WORDS.len()]
                })
                .collect();
            writeln!(out, "{}", line.join(" ")).map_err(|e| Error::io("write input", e))?;
        }
        out.flush().map_err(|e| Error::io("write input", e))?;
    }
    std::fs::write(&stamp, params).map_err(|e| Error::io("write input stamp", e))?;
    Ok(())
}

/// Count the words of every input file directly (the independent check).
pub fn count_input(dir: &Path, partitions: u32) -> Result<BTreeMap<String, u64>> {
    let mut counts = BTreeMap::new();
    for p in 0..partitions {
        let path = dir.join(format!("{p}.txt"));
        let text = std::fs::read_to_string(&path)
            .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
        for w in text.split_whitespace() {
            *counts.entry(w.to_string()).or_insert(0) += 1;
        }
    }
    Ok(counts)
}

/// Sum the counts held by every task's store (opened read-only on a copy-free basis: the
/// stores must be closed).
pub fn count_stores(state_dir: &Path, partitions: u32) -> Result<BTreeMap<String, u64>> {
    let mut counts = BTreeMap::new();
    for p in 0..partitions {
        let dir = store_dir(state_dir, "counts", &task_name(p))?;
        let db = RocksStore::open("counts", &dir)?;
        for item in db.db().iterator(rocksdb::IteratorMode::Start) {
            let (k, v) =
                item.map_err(|e| Error::new(crate::ErrorKind::Io, format!("iterate counts: {e}")))?;
            let w = String::from_utf8(k.to_vec())
                .map_err(|_| Error::corrupt("a word that is not UTF-8"))?;
            *counts.entry(w).or_insert(0) += decode(&v)?;
        }
    }
    Ok(counts)
}

/// The `lengths` stores against an independent count of word lengths in the input, each
/// partition counted from the offset its store started at ([`LENGTHS_FROM_KEY`]; a store that
/// counted nothing yet counts nothing): `(stored, expected)`, summed over the partitions. The
/// stores must be closed.
pub fn check_lengths(
    state_dir: &Path,
    input_dir: &Path,
    partitions: u32,
) -> Result<(BTreeMap<String, u64>, BTreeMap<String, u64>)> {
    let (mut stored, mut expected) = (BTreeMap::new(), BTreeMap::new());
    for p in 0..partitions {
        let dir = store_dir(state_dir, "lengths", &task_name(p))?;
        let db = RocksStore::open("lengths", &dir)?;
        let mut from = None;
        for item in db.db().iterator(rocksdb::IteratorMode::Start) {
            let (k, v) = item
                .map_err(|e| Error::new(crate::ErrorKind::Io, format!("iterate lengths: {e}")))?;
            if *k == *LENGTHS_FROM_KEY.as_bytes() {
                from = Some(decode(&v)?);
                continue;
            }
            let len = String::from_utf8(k.to_vec())
                .map_err(|_| Error::corrupt("a word length that is not UTF-8"))?;
            *stored.entry(len).or_insert(0) += decode(&v)?;
        }
        let Some(from) = from else { continue };
        let path = input_dir.join(format!("{p}.txt"));
        let text =
            std::fs::read(&path).map_err(|e| Error::io(format!("read {}", path.display()), e))?;
        let rest = usize::try_from(from)
            .ok()
            .and_then(|from| text.get(from..))
            .ok_or_else(|| {
                Error::corrupt(format!(
                    "the lengths store of partition {p} starts at offset {from}, past its input's {} bytes",
                    text.len()
                ))
            })?;
        for w in String::from_utf8_lossy(rest).split_whitespace() {
            *expected.entry(format!("{:04}", w.len())).or_insert(0) += 1;
        }
    }
    Ok((stored, expected))
}

/// Run every task of the demo concurrently to the end of the input. First the job's
/// resources: created when `settings.create_resources`, then validated — always, before any
/// task claims or commits (DESIGN §10: a lifecycle rule that expires the prefix, a scope
/// owned by another deployment, credentials that answer 403 for a missing key each stop the
/// job here, named, before it writes state).
pub async fn run(
    settings: &JobSettings,
    blob_store: Arc<dyn BlobStore>,
    admin: &dyn StateBackendAdmin,
    clock: Arc<dyn Clock>,
    on_commit: Arc<CommitObserver>,
) -> Result<Vec<TaskSummary>> {
    if settings.create_resources {
        admin
            .create_resources()
            .await
            .map_err(|e| e.context("create the job's resources"))?;
    }
    admin
        .validate_resources()
        .await
        .map_err(|e| e.context("validate the job's resources"))?;
    crate::job::check_start_from(settings, &blob_store).await?;
    let processor: Arc<dyn Processor> = Arc::new(WordCount);
    // One backend for every task: its managers share the store handle, and with it the
    // store's one transfer budget.
    let backend: Arc<dyn StateBackendFactory> = Arc::new(BlobStateBackendFactory::new(
        Arc::clone(&blob_store),
        None,
        BackupSettings {
            retention: settings.retention,
            tiered_retention: !settings.retention_tiers.is_empty(),
            gc_grace: settings.gc_grace,
            inline_below: settings.index_inline_below,
            // `run_task` holds the task's lease from its claim to its stop.
            writer_lease: false,
            pre_upload: settings.pre_upload,
            ..Default::default()
        },
        RestoreSettings {
            cancel: settings.stop.clone(),
            lazy: (settings.restore_mode == crate::job::RestoreMode::Lazy).then(|| {
                crate::local::lazy::Background {
                    max_rate: settings.lazy_download_rate,
                    ..Default::default()
                }
            }),
            ..Default::default()
        },
        settings.deployment_id.clone(),
    ));
    let mut handles = Vec::new();
    for p in 0..settings.partitions {
        let (settings, store, backend, clock, processor, on_commit) = (
            settings.clone(),
            Arc::clone(&blob_store),
            Arc::clone(&backend),
            Arc::clone(&clock),
            Arc::clone(&processor),
            Arc::clone(&on_commit),
        );
        handles.push(tokio::spawn(async move {
            run_task(
                &settings,
                p,
                store,
                &backend,
                clock,
                processor,
                on_commit.as_ref(),
            )
            .await
        }));
    }
    // Every task ends before the job does, whichever fails or stops first: returning at the
    // first error would end the process while the others still commit, close their stores
    // and delete their writer leases (issue 51, item 7: leases a graceful stop left behind
    // blocked another host's `gc` for the whole grace).
    let mut out = Vec::new();
    let mut failed = None;
    // A graceful stop ends every task with `Cancelled`, each naming the offset it committed:
    // the job's error names them all, not only the first. Any other failure wins over a stop
    // (it is what the exit must say).
    let mut stopped: Vec<Error> = Vec::new();
    for h in handles {
        match h.await.map_err(|e| Error::task("job", e)).and_then(|r| r) {
            Ok(summary) => out.push(summary),
            Err(e) if e.kind() == crate::error::ErrorKind::Cancelled => stopped.push(e),
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    match stopped.len() {
        0 => Ok(out),
        1 => Err(stopped.remove(0)),
        _ => Err(Error::new(
            crate::error::ErrorKind::Cancelled,
            stopped
                .iter()
                .map(|e| e.message().to_string())
                .collect::<Vec<_>>()
                .join("; "),
        )),
    }
}
