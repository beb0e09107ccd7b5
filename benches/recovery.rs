//! Time to the first processed message after a task is killed (not a test: it prints numbers).
//!
//! ```sh
//! cargo bench --bench recovery -- [--size-mib 1024,8192] [--store local|s3] [--last-commit-mib N] [--lazy-rate-mib N]
//!     [--workload wordcount|zipf] [--window-secs 60] [--lines N]
//! ```
//!
//! For each size: a word-count task whose store holds that much data (random 16 KiB values
//! beside the counts) runs in a child process against the blob store, commits a few times,
//! and is SIGKILLed mid-stream while a warm standby (in this process) follows it on a third
//! "host". Then the task is started again, each time as a new process: (a) on the same host
//! (its store dir as the killed process left it), (b) on a new host (nothing local), (c) on
//! the standby's host. Each child reports the time from its start to its first processed
//! message and the blob bytes it downloaded by then; the parent reports the wall time from
//! spawn to that message. Restarts are killed as soon as they processed a message.
//!
//! Then (d) a new host restoring lazily (`restore-mode = "lazy"`): its first message, the
//! bytes fetched before it, the time until its store is complete and the messages processed
//! meanwhile, against (e) the steady throughput of a task restored in full. `--lazy-rate-mib
//! N` bounds the lazy restore's background download to N MiB/s (`Background::max_rate`; 0:
//! unbounded; default `lazy::DEFAULT_RATE`, 200 MiB/s).
//!
//! Last, (f) a fork: a savepoint of the task's latest checkpoint, and another job id started
//! from it (`start-from = "savepoint:JOB/ID/NAME"`) on a new host, lazily: its first message.
//!
//! `--last-commit-mib N`: the task writes N MiB of random values before its third commit,
//! and the standby is stopped once it holds the second, so a failover to its host fetches
//! the last commit's N MiB (issue 18 §2's bound: 2 s + those bytes ÷ the GET rate).
//!
//! `--workload zipf` (issue 34): each message is, instead of the word count, a
//! read-modify-write on the seeded values, the key drawn from a Zipf distribution (exponent 1:
//! a tenth of the keys take ~80 % of the reads, the hottest ranks contiguous from a third of
//! the key space): it reads the 16 KiB value and updates a small per-key record (`rmw<key>`:
//! the count and a checksum of what it read; these sort after every seeded key).
//! The killed task's reads become the heat of its last commits (issue 34). For (d), the lazy
//! restart, and (e), the steady one, the child then reports over its first `--window-secs`
//! (default 60) after its first message: messages, their rate and the p50/p99 of the time a
//! message takes (`WINDOW`), and (d) when the hot set — the fewest table files holding 90 %
//! of the workload's reads, by their key ranges at the first message — was local (`HOT`).
//! `--lines N` sets the input's length (default 3,000,000; zipf runs want ~8,000,000 so the
//! steady task still has input for its window).
//!
//! `--store local` (the default): a local directory store under the work dir. `--store s3`:
//! the server of `BLOBSNAP_TEST_S3_ENDPOINT` (as `minio/garage.sh env` or `minio/localstack.sh
//! env` print it), with `unsafe_no_fencing` (Garage does not fence).

mod common;
use common::{arg, fill};

use std::io::BufRead as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blobsnap::backend::{StateBackendAdmin as _, StateBackendFactory, SystemClock};
use blobsnap::blob::factory::BlobStateBackendFactory;
use blobsnap::blob::restore::RestoreSettings;
use blobsnap::blobstore::counting::{Counters, CountingStore};
use blobsnap::blobstore::BlobStore;
use blobsnap::job::standby::{follow, StandbySettings, StandbyUpdate};
use blobsnap::job::wordcount::WordCount;
use blobsnap::job::{Message, Processor, Stores};
use blobsnap::local::rocks::RocksStore;

const TASK: &str = "Partition 0";
/// Input lines unless `--lines` says otherwise.
const LINES: u64 = 3_000_000;
const COMMIT_EVERY: u64 = 20_000;

fn job(state: &std::path::Path, input: &std::path::Path, id: &str) -> blobsnap::job::JobSettings {
    blobsnap::job::JobSettings {
        job_name: "recovery".into(),
        job_id: id.into(),
        state_dir: state.to_path_buf(),
        input_dir: input.to_path_buf(),
        stream: "lines".into(),
        partitions: 1,
        stores: vec!["counts".into()],
        commit_every: COMMIT_EVERY,
        commit_interval: Duration::ZERO,
        retention: 2,
        unsafe_no_fencing: true,
        commit_max_delay: Duration::from_secs(600),
        sweep_every_commits: 0,
        gc_grace: Duration::from_secs(6 * 3600),
        restore_fallback: false,
        deployment_id: "bench".into(),
        create_resources: true,
        index_inline_below: blobsnap::blob::backup::INLINE_BELOW,
        restore_mode: blobsnap::job::RestoreMode::Full,
        lazy_download_rate: blobsnap::local::lazy::DEFAULT_RATE,
        pre_upload: false,
        start_from: None,
        start_from_id: None,
        retention_tiers: Vec::new(),
        stop: Default::default(),
    }
}

/// The blob store as the settings and the environment name it (the child's and the
/// standby's are the same).
async fn open_store() -> Arc<dyn BlobStore> {
    blobsnap::config::Settings::load(None)
        .expect("settings")
        .open_store()
        .await
        .expect("open the blob store")
}

fn backend(store: &Arc<dyn BlobStore>) -> Arc<dyn StateBackendFactory> {
    // RECOVERY_RESTORE_MODE=lazy: the child restores lazily (issue 20).
    let lazy = std::env::var("RECOVERY_RESTORE_MODE").as_deref() == Ok("lazy");
    Arc::new(BlobStateBackendFactory::new(
        Arc::clone(store),
        None,
        Default::default(),
        RestoreSettings {
            lazy: lazy.then(|| blobsnap::local::lazy::Background {
                // RECOVERY_LAZY_RATE_MIB: the background download's bound (0: none).
                max_rate: std::env::var("RECOVERY_LAZY_RATE_MIB")
                    .ok()
                    .and_then(|v| v.parse::<u64>().ok())
                    .map_or(blobsnap::local::lazy::DEFAULT_RATE, |m| m << 20),
                ..Default::default()
            }),
            ..Default::default()
        },
        "bench",
    ))
}

/// The `--workload zipf` state access: ranks drawn from Zipf(1) over the `n` seeded keys
/// (inverse CDF by binary search), rank `r` being key `(r + n / 3) % n`.
struct Zipf {
    cdf: Vec<f64>,
    rng: std::sync::Mutex<rand::rngs::StdRng>,
}

impl Zipf {
    fn new(n: u64) -> Zipf {
        use rand::SeedableRng as _;
        let mut cdf = Vec::with_capacity(n as usize + 1);
        let mut sum = 0.0;
        cdf.push(0.0);
        for r in 0..n {
            sum += 1.0 / (r + 1) as f64;
            cdf.push(sum);
        }
        for c in &mut cdf {
            *c /= sum;
        }
        Zipf {
            cdf,
            rng: std::sync::Mutex::new(rand::rngs::StdRng::seed_from_u64(
                std::process::id().into(),
            )),
        }
    }

    fn n(&self) -> u64 {
        self.cdf.len() as u64 - 1
    }

    fn key_of_rank(&self, r: u64) -> u64 {
        (r + self.n() / 3) % self.n()
    }

    fn draw(&self) -> u64 {
        use rand::Rng as _;
        let u: f64 = self.rng.lock().expect("rng").random();
        let r = self.cdf.partition_point(|c| *c <= u).saturating_sub(1) as u64;
        self.key_of_rank(r.min(self.n() - 1))
    }

    /// The share of the reads that go to keys `lo..=hi`.
    fn mass(&self, lo: u64, hi: u64) -> f64 {
        (lo..=hi)
            .map(|k| {
                let r = (k + self.n() - self.n() / 3) % self.n();
                self.cdf[r as usize + 1] - self.cdf[r as usize]
            })
            .sum()
    }

    /// Read key `k`'s value and update its record: `rmw<k>` = count, checksum of the value.
    fn rmw(&self, db: &RocksStore) -> blobsnap::Result<()> {
        let k = self.draw();
        let value = db
            .db()
            .get(format!("key{k:012}"))
            .map_err(|e| {
                blobsnap::Error::new(blobsnap::ErrorKind::Io, format!("read key{k:012}: {e}"))
            })?
            .unwrap_or_default();
        let rec = format!("rmw{k:012}");
        let count = db
            .db()
            .get(&rec)
            .map_err(|e| blobsnap::Error::new(blobsnap::ErrorKind::Io, format!("read {rec}: {e}")))?
            .and_then(|v| {
                v.get(..8)
                    .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
            })
            .unwrap_or(0);
        let mut out = (count + 1).to_le_bytes().to_vec();
        out.extend_from_slice(&crc32fast::hash(&value).to_le_bytes());
        db.db()
            .put(rec.as_bytes(), out)
            .map_err(|e| blobsnap::Error::new(blobsnap::ErrorKind::Io, format!("write {rec}: {e}")))
    }

    /// The fewest table files of `db` that hold 90 % of the reads (by their key ranges), with
    /// their bytes.
    fn hot_set(&self, db: &RocksStore) -> Vec<(String, u64)> {
        let n = self.n();
        // The first seeded key >= `key` (up), or the last <= `key` (u64::MAX: none).
        let idx = |key: &[u8], up: bool| -> u64 {
            let (mut lo, mut hi) = (0u64, n);
            while lo < hi {
                let mid = (lo + hi) / 2;
                if format!("key{mid:012}").as_bytes() < key {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            if up || (lo < n && format!("key{lo:012}").as_bytes() == key) {
                lo
            } else {
                lo.wrapping_sub(1)
            }
        };
        let mut files: Vec<(String, u64, f64)> = db
            .db()
            .live_files()
            .unwrap_or_default()
            .into_iter()
            .map(|f| {
                let lo = f.start_key.as_deref().map_or(0, |k| idx(k, true));
                let hi = f.end_key.as_deref().map_or(u64::MAX, |k| idx(k, false));
                let mass = if hi == u64::MAX || lo > hi || lo >= self.n() {
                    0.0
                } else {
                    self.mass(lo, hi.min(self.n() - 1))
                };
                (
                    f.name.trim_start_matches('/').to_string(),
                    f.size as u64,
                    mass,
                )
            })
            .collect();
        files.sort_by(|a, b| b.2.total_cmp(&a.2));
        let mut got = 0.0;
        let mut hot = Vec::new();
        for (name, size, mass) in files {
            if got >= 0.9 {
                break;
            }
            got += mass;
            hot.push((name, size));
        }
        hot
    }
}

/// Messages between two `AT` lines of a child (its throughput samples).
const SAMPLE_EVERY: u64 = 25_000;

/// Word count that prints `FIRST <seconds since the process started> <blob bytes fetched>`
/// at its first message.
/// With `bulk_mib` > 0, the message half-way to the third commit also writes that many MiB
/// of random values: the last commit before the kill adds real volume.
struct First {
    start: Instant,
    printed: AtomicBool,
    counters: Arc<Counters>,
    processed: std::sync::atomic::AtomicU64,
    bulk_mib: u64,
    /// `--workload zipf`: the read-modify-write, and the window's per-message times (µs).
    zipf: Option<Zipf>,
    window: std::sync::Mutex<Window>,
    /// The store's dir (where a lazily restored file appears once local).
    dir: std::path::PathBuf,
}

/// A child's first `--window-secs` after its first message.
#[derive(Default)]
struct Window {
    first: Option<Instant>,
    micros: Vec<u32>,
    reported: bool,
}

impl Processor for First {
    fn process(&self, stores: &Stores, message: &Message) -> blobsnap::Result<()> {
        if !self.printed.swap(true, Ordering::SeqCst) {
            println!(
                "FIRST {:.3} {}",
                self.start.elapsed().as_secs_f64(),
                self.counters.snapshot().get.bytes
            );
        }
        let n = self.processed.fetch_add(1, Ordering::Relaxed);
        if n > 0 && n.is_multiple_of(SAMPLE_EVERY) {
            println!("AT {:.3} {n}", self.start.elapsed().as_secs_f64());
        }
        if self.bulk_mib > 0 && n == 2 * COMMIT_EVERY + COMMIT_EVERY / 2 {
            if let Some(db) = stores.get("counts") {
                fill(db, 1 << 40, self.bulk_mib << 20, 99);
                println!("BULK {}", self.bulk_mib);
            }
        }
        let Some(zipf) = &self.zipf else {
            return WordCount.process(stores, message);
        };
        let t = Instant::now();
        let db = stores.get("counts").ok_or_else(|| {
            blobsnap::Error::new(blobsnap::ErrorKind::InvalidInput, "no store counts")
        })?;
        if n == 0 {
            self.watch_hot_set(zipf.hot_set(db));
        }
        zipf.rmw(db)?;
        self.record(t.elapsed());
        Ok(())
    }
}

impl First {
    /// Print `HOT <seconds after the first message> <files> <bytes>` once every file of the
    /// hot set is in the store dir (a lazily restored file appears there once local).
    fn watch_hot_set(&self, hot: Vec<(String, u64)>) {
        let (dir, t0) = (self.dir.clone(), Instant::now());
        std::thread::spawn(move || loop {
            if hot.iter().all(|(n, _)| dir.join(n).exists()) {
                println!(
                    "HOT {:.3} {} {}",
                    t0.elapsed().as_secs_f64(),
                    hot.len(),
                    hot.iter().map(|(_, b)| b).sum::<u64>()
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        });
    }

    /// Record a message's time; past the window, print `WINDOW <messages> <seconds> <p50 µs>
    /// <p99 µs>` once.
    fn record(&self, took: Duration) {
        let secs: f64 = std::env::var("RECOVERY_WINDOW_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(60.0);
        let mut w = self.window.lock().expect("window");
        let first = *w.first.get_or_insert_with(Instant::now);
        if w.reported {
            return;
        }
        let elapsed = first.elapsed().as_secs_f64();
        if elapsed < secs {
            w.micros.push(took.as_micros().min(u32::MAX as u128) as u32);
            return;
        }
        w.reported = true;
        let n = w.micros.len();
        w.micros.sort_unstable();
        let pct = |p: f64| {
            w.micros
                .get(((n as f64 * p) as usize).min(n.saturating_sub(1)))
                .copied()
                .unwrap_or(0)
        };
        println!("WINDOW {n} {elapsed:.3} {} {}", pct(0.5), pct(0.99));
    }
}

/// The task, in this (child) process, until killed or the end of its input.
fn child(start: Instant) {
    let state = std::env::var("RECOVERY_STATE").expect("RECOVERY_STATE");
    let input = std::env::var("RECOVERY_INPUT").expect("RECOVERY_INPUT");
    let id = std::env::var("RECOVERY_JOB_ID").expect("RECOVERY_JOB_ID");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let mut settings = job(state.as_ref(), input.as_ref(), &id);
        // RECOVERY_START_FROM: the task starts there (a fork: savepoint:JOB/ID/NAME).
        if let Ok(point) = std::env::var("RECOVERY_START_FROM") {
            settings.start_from = Some(point.parse().expect("RECOVERY_START_FROM"));
        }
        let counting = CountingStore::new(open_store().await);
        let counters = counting.counters();
        let counters2 = Arc::clone(&counters);
        let store: Arc<dyn BlobStore> = Arc::new(counting);
        let admin = blobsnap::blob::admin::BlobStoreAdmin::new(
            Arc::clone(&store),
            None,
            &settings.job_name,
            &settings.job_id,
            &settings.deployment_id,
        )
        .expect("admin")
        .with_gc_grace(settings.gc_grace);
        admin.create_resources().await.expect("create resources");
        admin
            .validate_resources()
            .await
            .expect("validate resources");
        // A lazy restore: once the first message is processed, report when the store is
        // complete (`COMPLETE <seconds> <messages processed> <blob bytes fetched>`).
        let dir = blobsnap::job::store_dir(state.as_ref(), "counts", TASK).expect("store dir");
        let processor = Arc::new(First {
            start,
            printed: AtomicBool::new(false),
            counters,
            processed: 0.into(),
            bulk_mib: std::env::var("RECOVERY_BULK_MIB")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            zipf: std::env::var("RECOVERY_KEYS")
                .ok()
                .and_then(|v| v.parse().ok())
                .filter(|_| std::env::var("RECOVERY_WORKLOAD").as_deref() == Ok("zipf"))
                .map(Zipf::new),
            window: Default::default(),
            dir: dir.clone(),
        });
        if std::env::var("RECOVERY_RESTORE_MODE").as_deref() == Ok("lazy") {
            let (p, c) = (Arc::clone(&processor), Arc::clone(&counters2));
            tokio::spawn(async move {
                while !p.printed.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let done = blobsnap::local::lazy::wait_complete(&dir).await;
                println!(
                    "COMPLETE {:.3} {} {} {}",
                    p.start.elapsed().as_secs_f64(),
                    p.processed.load(Ordering::Relaxed),
                    c.snapshot().get.bytes,
                    if done.is_ok() { "ok" } else { "failed" }
                );
            });
        }
        let on_commit = |_: &str,
                         r: &blobsnap::commit::CommitReport,
                         _: &dyn blobsnap::backend::TaskBackupManager| {
            println!("COMMIT {}", r.seq);
        };
        blobsnap::job::run_task(
            &settings,
            0,
            Arc::clone(&store),
            &backend(&store),
            Arc::new(SystemClock),
            processor,
            &on_commit,
        )
        .await
        .expect("task");
    });
}

/// Fill the store at `dir` with `size_mib` of random values and commit it, input offset 0.
async fn seed(settings: &blobsnap::job::JobSettings, dir: &std::path::Path, size_mib: u64) {
    use blobsnap::backend::{StoreEngine, StoreSpec, TaskContext};
    use blobsnap::checkpoint::{BlobCheckpointStore, Ssp};
    use blobsnap::commit::{Backend, TaskCommitManager};
    let store = open_store().await;
    let admin = blobsnap::blob::admin::BlobStoreAdmin::new(
        Arc::clone(&store),
        None,
        &settings.job_name,
        &settings.job_id,
        &settings.deployment_id,
    )
    .expect("admin")
    .with_gc_grace(settings.gc_grace);
    admin.create_resources().await.expect("create resources");
    let db = Arc::new(RocksStore::open("counts", dir).expect("open"));
    fill(&db, 0, size_mib << 20, 1);
    db.db().flush().expect("flush");
    db.db().compact_range::<&[u8], &[u8]>(None, None);
    let ctx = TaskContext {
        job_name: settings.job_name.clone(),
        job_id: settings.job_id.clone(),
        task_name: TASK.into(),
    };
    let clock: Arc<dyn blobsnap::backend::Clock> = Arc::new(SystemClock);
    let checkpoints = Arc::new(BlobCheckpointStore::new(
        Arc::clone(&store),
        blobsnap::layout::JobScope::new(&settings.job_name, &settings.job_id).expect("scope"),
    ));
    let (commits, last) =
        TaskCommitManager::start(ctx.clone(), checkpoints, Arc::clone(&clock), 2, true)
            .await
            .expect("claim");
    let specs = [StoreSpec {
        name: "counts".into(),
        dir: dir.to_path_buf(),
    }];
    let backend = backend(&store);
    let backup = backend.backup_manager(&ctx, &specs, clock).expect("backup");
    backup.init(last.as_ref()).await.expect("init");
    let commits = commits
        .with_stores(vec![Arc::clone(&db) as Arc<dyn StoreEngine>])
        .with_backends(
            vec![Backend {
                name: backend.name().into(),
                manager: backup,
            }],
            last,
        );
    commits
        .commit(std::collections::BTreeMap::from([(
            Ssp::new("files", "lines", 0),
            "0".to_string(),
        )]))
        .await
        .expect("commit");
}

/// A child's `AT` samples (seconds, messages) and its `COMPLETE` line (seconds, messages,
/// bytes fetched), if it came.
type Samples = (Vec<(f64, u64)>, Option<(f64, u64, u64)>);

/// A child process running the task on `state`.
struct Child {
    proc: std::process::Child,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
    spawned: Instant,
}

fn spawn(state: &std::path::Path, input: &std::path::Path, id: &str, bulk_mib: u64) -> Child {
    spawn_as(state, input, id, bulk_mib, "full")
}

fn spawn_as(
    state: &std::path::Path,
    input: &std::path::Path,
    id: &str,
    bulk_mib: u64,
    mode: &str,
) -> Child {
    spawn_from(state, input, id, bulk_mib, mode, None)
}

fn spawn_from(
    state: &std::path::Path,
    input: &std::path::Path,
    id: &str,
    bulk_mib: u64,
    mode: &str,
    start_from: Option<&str>,
) -> Child {
    let mut cmd = std::process::Command::new(std::env::current_exe().expect("exe"));
    if let Some(p) = start_from {
        cmd.env("RECOVERY_START_FROM", p);
    }
    let mut proc = cmd
        .env("RECOVERY_CHILD", "1")
        .env("RECOVERY_RESTORE_MODE", mode)
        .env("RECOVERY_BULK_MIB", bulk_mib.to_string())
        .env("RECOVERY_STATE", state)
        .env("RECOVERY_INPUT", input)
        .env("RECOVERY_JOB_ID", id)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the task");
    let out = proc.stdout.take().expect("stdout");
    Child {
        proc,
        lines: std::io::BufReader::new(out).lines(),
        spawned: Instant::now(),
    }
}

impl Child {
    /// The next line the task printed.
    fn line(&mut self) -> String {
        self.lines
            .next()
            .expect("the task ended early")
            .expect("read")
    }

    /// Wait for the first message: (wall seconds from spawn, the child's own seconds, blob
    /// bytes fetched before it).
    fn first(&mut self) -> (f64, f64, u64) {
        loop {
            let l = self.line();
            if let Some(rest) = l.strip_prefix("FIRST ") {
                let wall = self.spawned.elapsed().as_secs_f64();
                let mut it = rest.split(' ');
                let own = it.next().and_then(|s| s.parse().ok()).unwrap_or(f64::NAN);
                let bytes = it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
                return (wall, own, bytes);
            }
        }
    }

    /// After the first message: `AT` samples until `until` says stop (given the child's
    /// seconds and messages of each sample, or of `COMPLETE`); returns (the samples, the
    /// `COMPLETE` line's seconds, messages and bytes, if it came).
    fn samples(&mut self, mut until: impl FnMut(f64, u64, bool) -> bool) -> Samples {
        let mut at = Vec::new();
        loop {
            let Some(Ok(l)) = self.lines.next() else {
                return (at, None);
            };
            let f: Vec<&str> = l.split(' ').collect();
            match f.as_slice() {
                ["AT", t, n] => {
                    let (t, n) = (t.parse().unwrap_or(0.0), n.parse().unwrap_or(0));
                    at.push((t, n));
                    if until(t, n, false) {
                        return (at, None);
                    }
                }
                ["COMPLETE", t, n, b, ..] => {
                    let c = (
                        t.parse().unwrap_or(0.0),
                        n.parse().unwrap_or(0),
                        b.parse().unwrap_or(0),
                    );
                    if until(c.0, c.1, true) {
                        return (at, Some(c));
                    }
                }
                _ => {}
            }
        }
    }

    /// The first line of each tag in `tags` (its fields after the tag), until every one has
    /// come or the task ended.
    fn tags(&mut self, tags: &[&str]) -> std::collections::BTreeMap<String, Vec<f64>> {
        let mut got = std::collections::BTreeMap::new();
        while got.len() < tags.len() {
            let Some(Ok(l)) = self.lines.next() else {
                break;
            };
            let mut f = l.split(' ');
            let Some(tag) = f.next().filter(|t| tags.contains(t)) else {
                continue;
            };
            got.entry(tag.to_string())
                .or_insert_with(|| f.map(|v| v.parse().unwrap_or(f64::NAN)).collect());
        }
        got
    }

    fn kill(mut self) {
        let _ = self.proc.kill(); // SIGKILL
        let _ = self.proc.wait();
    }
}

/// The zipf workload's row for a lazy restart ((d), or the standby's failover) against (e):
/// the window's rate and p99 against the steady task's, when the hot set was local, and when
/// the store was complete against 1.1 × what it had to download ÷ the background's rate
/// bound.
fn zipf_row(
    label: &str,
    download_mib: u64,
    first: f64,
    rate_mib: u64,
    lazy: &std::collections::BTreeMap<String, Vec<f64>>,
    steady: &std::collections::BTreeMap<String, Vec<f64>>,
) -> String {
    let field = |m: &std::collections::BTreeMap<String, Vec<f64>>, tag: &str, i: usize| {
        m.get(tag)
            .and_then(|v| v.get(i))
            .copied()
            .unwrap_or(f64::NAN)
    };
    let rate = |m| field(m, "WINDOW", 0) / field(m, "WINDOW", 1);
    let (lazy_rate, steady_rate) = (rate(lazy), rate(steady));
    let (lazy_p99, steady_p99) = (field(lazy, "WINDOW", 3), field(steady, "WINDOW", 3));
    let complete = field(lazy, "COMPLETE", 0) - first;
    let bound = 1.1 * download_mib as f64 / rate_mib.max(1) as f64;
    eprintln!(
        "{label}: p50 {:.0} / {:.0} µs (lazy / steady)",
        field(lazy, "WINDOW", 2),
        field(steady, "WINDOW", 2)
    );
    format!(
        "| {label} | {lazy_rate:.0} / {steady_rate:.0} msg/s = {:.0} % | {lazy_p99:.0} / {steady_p99:.0} µs = {:.2}× | {:.2} s ({} files, {:.0} MiB) | {complete:.1} s (bound {bound:.1} s) |",
        100.0 * lazy_rate / steady_rate,
        lazy_p99 / steady_p99,
        field(lazy, "HOT", 0),
        field(lazy, "HOT", 1),
        field(lazy, "HOT", 2) / (1 << 20) as f64,
    )
}

fn main() {
    let start = Instant::now();
    if std::env::var_os("RECOVERY_CHILD").is_some() {
        return child(start);
    }
    let sizes: Vec<u64> = arg("--size-mib")
        .unwrap_or_else(|| "1024,8192".into())
        .split(',')
        .map(|s| s.parse().expect("--size-mib"))
        .collect();
    let kind = arg("--store").unwrap_or_else(|| "local".into());
    let bulk_mib: u64 =
        arg("--last-commit-mib").map_or(0, |v| v.parse().expect("--last-commit-mib"));
    let zipf = match arg("--workload").as_deref() {
        None | Some("wordcount") => false,
        Some("zipf") => true,
        Some(other) => panic!("--workload {other}: wordcount or zipf"),
    };
    if zipf {
        std::env::set_var("RECOVERY_WORKLOAD", "zipf");
    }
    let window_secs: f64 = arg("--window-secs").map_or(60.0, |v| v.parse().expect("--window-secs"));
    std::env::set_var("RECOVERY_WINDOW_SECS", window_secs.to_string());
    let lines: u64 = arg("--lines").map_or(LINES, |v| v.parse().expect("--lines"));
    let lazy_rate_mib: u64 = arg("--lazy-rate-mib")
        .map_or(blobsnap::local::lazy::DEFAULT_RATE >> 20, |v| {
            v.parse().expect("--lazy-rate-mib")
        });
    if let Some(rate) = arg("--lazy-rate-mib") {
        let _: u64 = rate.parse().expect("--lazy-rate-mib N");
        std::env::set_var("RECOVERY_LAZY_RATE_MIB", rate);
    }
    let work =
        tempfile::tempdir_in(std::env::var("BENCH_TMP").unwrap_or_else(|_| "/var/tmp".into()))
            .expect("work dir");
    match kind.as_str() {
        "local" => {
            std::env::set_var("BLOBSNAP_STORE", "local");
            std::env::set_var("BLOBSNAP_LOCAL_DIR", work.path().join("blobstore"));
        }
        "s3" => {
            let get = |k: &str| {
                std::env::var(k).unwrap_or_else(|_| panic!("{k} (run minio/garage.sh env)"))
            };
            std::env::set_var("BLOBSNAP_STORE", "s3");
            std::env::set_var("BLOBSNAP_S3_ENDPOINT", get("BLOBSNAP_TEST_S3_ENDPOINT"));
            std::env::set_var("BLOBSNAP_S3_BUCKET", get("BLOBSNAP_TEST_S3_BUCKET"));
            std::env::set_var("BLOBSNAP_S3_PATH_STYLE", "true");
            std::env::set_var("BLOBSNAP_S3_CREATE_ONLY", "ignored");
            std::env::set_var("AWS_ACCESS_KEY_ID", get("BLOBSNAP_TEST_S3_ACCESS_KEY"));
            std::env::set_var("AWS_SECRET_ACCESS_KEY", get("BLOBSNAP_TEST_S3_SECRET_KEY"));
            if let Ok(r) = std::env::var("BLOBSNAP_TEST_S3_REGION") {
                std::env::set_var("BLOBSNAP_S3_REGION", r);
            }
        }
        other => panic!("--store {other}: local or s3"),
    }
    let input = work.path().join("input");
    blobsnap::job::wordcount::generate_input(&input, 1, lines, 7).expect("input");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "| store | case | first message, wall (s) | in the task (s) | downloaded before it (MiB) |"
    );
    println!("|---|---|---|---|---|");
    let mut zipf_rows = Vec::new();
    for size in sizes {
        let id = format!("bench-{size}-{:08x}", rand::random::<u32>());
        // The seeded keys (`fill`'s 16 KiB values): what the zipf workload draws from.
        std::env::set_var("RECOVERY_KEYS", ((size << 20) / (16 << 10)).to_string());
        let host = |h: &str| work.path().join(h).join("state");
        let (a, b, c) = (host("a"), host("b"), host("c"));
        // The task's store, prefilled and committed at input offset 0 (as a job that has run
        // for a while has it; a task with no checkpoint would reset its store to empty).
        let dir = blobsnap::job::store_dir(&a, "counts", TASK).expect("store dir");
        let t = Instant::now();
        rt.block_on(seed(&job(&a, &input, &id), &dir, size));
        eprintln!(
            "{size} MiB: seeded and committed in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        // A standby on host c, warm before the task runs on (it holds the seeded commit).
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let stop = tokio_util::sync::CancellationToken::new();
        let standby = {
            let (settings, stop) = (job(&c, &input, &id), stop.clone());
            rt.spawn(async move {
                let store = open_store().await;
                let on_update = move |u: &StandbyUpdate| {
                    let _ = tx.send(u.clone());
                };
                follow(
                    &settings,
                    TASK,
                    Arc::clone(&store),
                    &backend(&store),
                    Arc::new(SystemClock),
                    &StandbySettings {
                        poll: Duration::from_millis(200),
                    },
                    stop,
                    &on_update,
                )
                .await
            })
        };
        let t = Instant::now();
        let mut standby_seq = 0;
        while standby_seq == 0 {
            if let Some(StandbyUpdate::Applied { seq, .. }) = rt.block_on(rx.recv()) {
                standby_seq = seq;
            }
        }
        eprintln!(
            "{size} MiB: the standby holds #{standby_seq} after {:.1} s",
            t.elapsed().as_secs_f64()
        );
        // The task runs on host a and is killed mid-stream after three commits. With
        // `--last-commit-mib`, the standby is stopped once it holds the second commit, and the
        // third adds that much: a failover to the standby's host must fetch it.
        let mut task = spawn(&a, &input, &id, bulk_mib);
        let mut commits = 0;
        let mut applied_before_stop = 0;
        while commits < 3 {
            let line = task.line();
            let Some(seq) = line.strip_prefix("COMMIT ") else {
                continue;
            };
            commits += 1;
            if commits == 2 && bulk_mib > 0 {
                let seq: u64 = seq.parse().expect("seq");
                while applied_before_stop < seq {
                    match rt.block_on(rx.recv()) {
                        Some(StandbyUpdate::Applied { seq, .. }) => applied_before_stop = seq,
                        Some(_) => {}
                        None => break,
                    }
                }
                stop.cancel();
                eprintln!("{size} MiB: the standby stopped at #{applied_before_stop}, before the bulk commit");
            }
        }
        let killed_at = Instant::now();
        task.kill();
        eprintln!(
            "{size} MiB: killed after {commits} commits, {:.1} s into the run",
            killed_at.duration_since(start).as_secs_f64()
        );
        // Without the bulk commit: let the standby catch up with the last commit (as it would
        // in the seconds a failover takes to be decided), then stop it.
        if bulk_mib == 0 {
            std::thread::sleep(Duration::from_secs(2));
        }
        stop.cancel();
        let _ = rt.block_on(standby);
        let mut last_delta = 0;
        while let Ok(u) = rx.try_recv() {
            if let StandbyUpdate::Applied {
                seq,
                bytes_downloaded,
                ..
            } = u
            {
                eprintln!(
                    "{size} MiB: standby applied #{seq}, downloading {bytes_downloaded} bytes"
                );
                last_delta = bytes_downloaded;
            }
        }

        let mut get_rate = None;
        let mut failover = None;
        for (case, state) in [("same host", &a), ("new host", &b), ("standby host", &c)] {
            // With the zipf workload the standby's host restarts lazily (issue 34): its first
            // 60 s, hot set and download are measured as (d)'s.
            let lazy_failover = zipf && case == "standby host";
            let mode = if lazy_failover { "lazy" } else { "full" };
            let mut t = spawn_as(state, &input, &id, 0, mode);
            let (wall, own, bytes) = t.first();
            if lazy_failover {
                failover = Some((own, t.tags(&["WINDOW", "HOT", "COMPLETE"])));
            }
            t.kill();
            println!(
                "| {kind}, {size} MiB | {case}{} | {wall:.2} | {own:.2} | {:.1} |",
                if lazy_failover { ", lazy" } else { "" },
                bytes as f64 / (1 << 20) as f64
            );
            if case == "new host" {
                get_rate = Some(bytes as f64 / own.max(1e-6));
            }
            if case == "standby host" {
                // Issue 18 §2's bound: 2 s + the last commit's new bytes ÷ the GET rate of
                // the same run (the new host's full download). With the bulk commit, what the
                // standby's host fetched is that commit's delta.
                if bulk_mib > 0 {
                    last_delta = bytes;
                }
                let bound = 2.0 + get_rate.map_or(0.0, |r| last_delta as f64 / r);
                eprintln!(
                    "{size} MiB: standby failover {wall:.2} s; bound 2 s + {:.1} MiB last commit ÷ {:.0} MiB/s = {bound:.2} s",
                    last_delta as f64 / (1 << 20) as f64,
                    get_rate.unwrap_or(0.0) / (1 << 20) as f64
                );
            }
        }
        // (d) a new host again, restoring lazily (issue 20): the first message, what was
        // fetched before it, and the throughput while the rest downloads in the background,
        // against the steady state of a full restore's task (e) on one more new host over the
        // same number of messages.
        let d = host("d");
        let mut t = spawn_as(&d, &input, &id, 0, "lazy");
        let (wall, own, bytes) = t.first();
        println!(
            "| {kind}, {size} MiB | new host, lazy | {wall:.2} | {own:.2} | {:.1} |",
            bytes as f64 / (1 << 20) as f64
        );
        if zipf {
            let got = t.tags(&["WINDOW", "HOT", "COMPLETE"]);
            t.kill();
            let mut e = spawn_as(&host("e"), &input, &id, 0, "full");
            e.first();
            let steady = e.tags(&["WINDOW"]);
            e.kill();
            let label = format!("{kind}, {size} MiB, new host");
            zipf_rows.push(zipf_row(&label, size, own, lazy_rate_mib, &got, &steady));
            if let Some((own, got)) = &failover {
                let label = format!("{kind}, {size} MiB, standby failover (+{bulk_mib} MiB)");
                zipf_rows.push(zipf_row(
                    &label,
                    bulk_mib,
                    *own,
                    lazy_rate_mib,
                    got,
                    &steady,
                ));
            }
            for h in ["a", "b", "c", "d", "e"] {
                let _ = std::fs::remove_dir_all(work.path().join(h));
            }
            continue;
        }
        let (_, complete) = t.samples(|_, _, complete| complete);
        t.kill();
        let Some((done_s, done_n, done_bytes)) = complete else {
            eprintln!("{size} MiB: the lazy task ended before its store was complete");
            continue;
        };
        let lazy_rate = done_n as f64 / (done_s - own).max(1e-6);
        let e = host("e");
        let mut t = spawn_as(&e, &input, &id, 0, "full");
        let (_, own_full, _) = t.first();
        let (at, _) = t.samples(|_, n, _| n >= done_n.max(2 * SAMPLE_EVERY));
        t.kill();
        let steady = match (at.first(), at.last()) {
            (Some(a), Some(b)) if b.1 > a.1 => (b.1 - a.1) as f64 / (b.0 - a.0).max(1e-6),
            _ => f64::NAN,
        };
        eprintln!(
            "{size} MiB: lazy restore complete {:.2} s after the first message ({:.1} MiB fetched in all); {done_n} messages meanwhile: {lazy_rate:.0} msg/s, vs {steady:.0} msg/s steady after a full restore (first message at {own_full:.2} s): {:.0} %",
            done_s - own,
            done_bytes as f64 / (1 << 20) as f64,
            100.0 * lazy_rate / steady
        );
        // (f) a fork of the task's latest checkpoint (issue 32 §5): another job id starts on
        // a new host from a savepoint of this one, lazily — its snapshot borrows every blob,
        // so what it fetches before its first message is what (d) fetched.
        let sp = format!("fork-{size}");
        rt.block_on(async {
            let store = open_store().await;
            blobsnap::blob::savepoint::create(
                &store,
                "recovery",
                &id,
                &sp,
                &blobsnap::blob::history::CheckpointRef::Latest,
            )
            .await
            .expect("savepoint");
        });
        let f = host("f");
        let source = format!("savepoint:recovery/{id}/{sp}");
        let mut t = spawn_from(&f, &input, &format!("{id}-fork"), 0, "lazy", Some(&source));
        let (wall, own, bytes) = t.first();
        t.kill();
        println!(
            "| {kind}, {size} MiB | fork on a new host, lazy | {wall:.2} | {own:.2} | {:.1} |",
            bytes as f64 / (1 << 20) as f64
        );
        let _ = std::fs::remove_dir_all(work.path().join("f"));
        let _ = std::fs::remove_dir_all(work.path().join("a"));
        let _ = std::fs::remove_dir_all(work.path().join("b"));
        let _ = std::fs::remove_dir_all(work.path().join("c"));
        let _ = std::fs::remove_dir_all(work.path().join("d"));
        let _ = std::fs::remove_dir_all(work.path().join("e"));
    }
    if zipf {
        println!();
        println!("| store | rate, first {window_secs:.0} s: lazy / steady | p99 per message: lazy / steady | hot set local after the first message | store complete after it |");
        println!("|---|---|---|---|---|");
        for row in zipf_rows {
            println!("{row}");
        }
    }
}
