//! The `blobsnap` command.

use std::io::Read as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use blobsnap::backend::{StoreSpec, TaskContext, TaskRestoreManager as _};
use blobsnap::blob::restore::{BlobRestoreManager, RestoreSettings};
use blobsnap::blob::FACTORY_NAME;
use blobsnap::blobstore::local::LocalStore;
use blobsnap::blobstore::retry::RetryStore;
use blobsnap::blobstore::BlobStore;
use blobsnap::checkpoint::{Checkpoint, CheckpointV2};
use blobsnap::config::{Settings, StoreKind};
use blobsnap::index::IndexMarker;
use blobsnap::{Error, ErrorKind};
use clap::{Args, Parser, Subcommand};

/// blobsnap: blob-store state backend for CheckpointV2 stream jobs.
///
/// Exit codes: 0 ok, 2 usage, 3 not found, 4 corrupt, 5 invalid input, 6 conflict,
/// 7 transient, 8 permanent, 9 I/O, 10 cancelled.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(flatten)]
    store: StoreArgs,
    /// Print machine-readable JSON on stdout (documents carry a `schema` number).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

/// Where the blob store is: a settings file, `BLOBSNAP_*`/`AWS_*` environment, or these flags
/// (flags win).
#[derive(Args)]
struct StoreArgs {
    /// A TOML settings file (see the README).
    #[arg(long, global = true, env = "BLOBSNAP_CONFIG")]
    config: Option<PathBuf>,
    /// Use the local directory store at DIR.
    #[arg(long, global = true, value_name = "DIR")]
    local: Option<PathBuf>,
    /// Use S3 (or an S3-compatible server) with this bucket.
    #[arg(long, global = true)]
    bucket: Option<String>,
    /// S3 endpoint URL (MinIO, LocalStack, Garage: http://127.0.0.1:PORT).
    #[arg(long, global = true)]
    s3_endpoint: Option<String>,
    /// S3 region.
    #[arg(long, global = true)]
    s3_region: Option<String>,
    /// Key prefix inside the bucket ("" or ending in "/").
    #[arg(long, global = true)]
    s3_prefix: Option<String>,
    /// Path-style addressing (most S3-compatible servers need it).
    #[arg(long, global = true)]
    s3_path_style: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Run the demo job (word count over generated text, one task per partition, RocksDB
    /// state backed up at every commit). State lives under --dir; without store flags the
    /// blob store is --dir/store. Kill it at any moment and run it again: it resumes from the
    /// last checkpoint and ends with counts equal to an independent count of the input.
    Demo {
        /// Where the input, the state and (by default) the blob store live.
        #[arg(long, default_value = "blobsnap-demo")]
        dir: PathBuf,
        /// Partitions (= tasks) [settings: job.partitions, default 4].
        #[arg(long)]
        partitions: Option<u32>,
        /// Lines of input per partition.
        #[arg(long, default_value_t = 20_000)]
        lines: u64,
        /// The stores of each task, comma-separated: `counts` (required) and optionally
        /// `lengths`. Adding a store to a job that already committed starts it empty.
        #[arg(long, default_value = "counts", value_delimiter = ',')]
        stores: Vec<String>,
        /// Commit every this many messages [job.commit-every, default 2500].
        #[arg(long)]
        commit_every: Option<u64>,
        /// Also commit every this many milliseconds [job.commit-ms, default 0: off].
        #[arg(long)]
        commit_ms: Option<u64>,
        /// Committed snapshots kept per store [job.retention, default 2].
        #[arg(long)]
        retention: Option<usize>,
        /// Run on a store that cannot fence a second writer (Garage, s3s-fs).
        #[arg(long)]
        unsafe_no_fencing: bool,
        /// If the last checkpoint's snapshot is corrupt or missing, restore the newest
        /// retained checkpoint that restores and resume from its offsets (logged loudly,
        /// counted in blobsnap_restore_fallbacks_total) [job.restore-fallback].
        #[arg(long)]
        restore_fallback: bool,
        /// Serve Prometheus metrics on this address while the demo runs (`127.0.0.1:9898`;
        /// port 0 picks a free one). The address bound is printed on stderr.
        #[arg(long)]
        metrics_addr: Option<std::net::SocketAddr>,
        /// Grace period of the sweep the tasks run every 20 commits, in seconds (at least 60:
        /// an upload running longer than half of it is abandoned) [job.gc-grace-secs].
        #[arg(long, value_parser = clap::value_parser!(u64).range(60..))]
        gc_grace_secs: Option<u64>,
    },
    /// Restore one store from a snapshot marker into a directory: the plan is printed first;
    /// only files missing locally are downloaded, every byte is verified, and the new tree is
    /// swapped in atomically.
    Restore {
        /// The marker (`index/<checkpoint-id>.<sha256>.json`); omitted: the store's marker in
        /// the task's latest committed checkpoint.
        marker: Option<String>,
        #[command(flatten)]
        snap: SnapshotArgs,
        /// The directory to restore into (created if missing). Its files are replaced by the
        /// snapshot's (those with the right bytes are reused): a non-empty directory that
        /// blobsnap did not restore (no `RESTORED` marker) is refused unless `--force`.
        #[arg(long)]
        to: PathBuf,
        /// Print the plan and stop.
        #[arg(long)]
        dry_run: bool,
        /// Replace the contents of a non-empty `--to` that blobsnap did not restore.
        #[arg(long)]
        force: bool,
    },
    /// Ask the S3 server what it really enforces: concurrent create-only puts to a scratch key
    /// (the fence of a job's checkpoints), SHA-256 verification, multipart listing, tagging,
    /// lifecycle. Prints the `[s3]` settings that describe it; writes and deletes a few
    /// objects under `<prefix>.blobsnap-probe/`.
    Probe,
    /// Sweep a job's scope: delete blobs and indexes that no retained checkpoint of any task
    /// references and that are older than the grace period; abort stale multipart uploads.
    /// Fails closed: if any root cannot be read, nothing is deleted.
    Gc {
        /// The job's name.
        #[arg(long)]
        job: String,
        /// The job's id.
        #[arg(long, default_value = "1")]
        job_id: String,
        /// Only this task.
        #[arg(long)]
        task: Option<String>,
        /// Only this store.
        #[arg(long)]
        store: Option<String>,
        /// Grace period in seconds: younger objects are never deleted.
        #[arg(long, default_value_t = 86_400)]
        grace_secs: u64,
        /// Print the plan (exactly what a real run deletes) and stop.
        #[arg(long)]
        dry_run: bool,
        /// Allow a grace shorter than the job's (recorded in its scope.json; 60 s if none):
        /// still refused while a task of the job holds a writer lease younger than its grace.
        #[arg(long)]
        force: bool,
    },
    /// Create or validate a job deployment's resources. The job itself creates them (unless
    /// job.create-resources = false) and validates them before its first commit.
    Admin {
        #[command(subcommand)]
        action: AdminAction,
    },
    /// Back up a closed RocksDB directory (or a RocksDB checkpoint directory) into its own
    /// scope, `manual/<name>/`, deduplicated against the previous backup of that name. Each
    /// backup is pinned by a checkpoint record, so `gc --job manual --job-id NAME` keeps it.
    /// A database locked by a running job is refused (exit 6).
    Backup {
        /// The RocksDB directory (closed), or a RocksDB checkpoint directory.
        #[arg(long)]
        db: PathBuf,
        /// The backup's name.
        #[arg(long)]
        name: String,
    },
    /// List what the store holds: jobs, tasks with their latest checkpoints, stores with their
    /// snapshots and sizes.
    Ls,
    /// Show a snapshot: its files, sizes and blobs, totals, and what it cost to upload and
    /// would cost to restore.
    Inspect {
        #[command(flatten)]
        snap: SnapshotArgs,
        /// The marker (`index/<checkpoint-id>.<sha256>.json`); omitted: the task's latest
        /// checkpoint (its offsets and markers are shown too).
        marker: Option<String>,
    },
    /// What changed between two snapshots of one store: files added, removed, changed and
    /// retained, with bytes.
    Diff {
        #[command(flatten)]
        snap: SnapshotArgs,
        /// The older marker.
        a: String,
        /// The newer marker.
        b: String,
    },
    /// Check that every object a snapshot references exists with the right size (HEAD);
    /// `--deep` downloads and checks every SHA-256 (`--sample PCT` for a random share).
    /// Exit code 3 if an object is missing, 4 if one is corrupt.
    Verify {
        #[command(flatten)]
        snap: SnapshotArgs,
        /// The marker (`index/<checkpoint-id>.<sha256>.json`); omitted: the task's latest
        /// checkpoint.
        marker: Option<String>,
        /// Download every blob and check its SHA-256.
        #[arg(long)]
        deep: bool,
        /// With --deep: download only this percentage of the blobs (rounded up), chosen at
        /// random; every blob is still checked by HEAD.
        #[arg(long, default_value_t = 100.0)]
        sample: f64,
    },
    /// Parse a CheckpointV2/V1 JSON document (ours or Samza's) and print it normalized.
    Checkpoint {
        #[command(subcommand)]
        action: ShowAction,
    },
    /// Parse and validate a snapshot index JSON document and print it normalized.
    Index {
        #[command(subcommand)]
        action: ShowAction,
    },
}

/// Which store's snapshots: job, job id, task, store.
#[derive(Args)]
struct SnapshotArgs {
    /// The job's name.
    #[arg(long)]
    job: String,
    /// The job's id.
    #[arg(long, default_value = "1")]
    job_id: String,
    /// The task's name.
    #[arg(long)]
    task: String,
    /// The store's name.
    #[arg(long)]
    store: String,
}

impl SnapshotArgs {
    async fn load(
        &self,
        blob_store: &dyn BlobStore,
        marker: &str,
    ) -> blobsnap::Result<(
        blobsnap::layout::StoreScope,
        IndexMarker,
        blobsnap::index::SnapshotIndex,
    )> {
        let m: IndexMarker = marker.parse()?;
        let scope = blobsnap::layout::JobScope::new(&self.job, &self.job_id)?
            .store(&self.task, &self.store)?;
        let expected = blobsnap::blob::Expected {
            job_name: &self.job,
            job_id: &self.job_id,
            task_name: &self.task,
            store_name: &self.store,
        };
        let index = blobsnap::blob::read_index(blob_store, &scope, &m, &expected).await?;
        Ok((scope, m, index))
    }
}

impl SnapshotArgs {
    /// The marker to use: the one given, or the store's marker in the task's latest checkpoint.
    async fn resolve_marker(
        &self,
        blob_store: &Arc<dyn BlobStore>,
        marker: Option<String>,
    ) -> blobsnap::Result<(String, Option<blobsnap::checkpoint::CommittedCheckpoint>)> {
        use blobsnap::checkpoint::CheckpointStore as _;
        let (job, job_id, task, store) = (&self.job, &self.job_id, &self.task, &self.store);
        if let Some(m) = marker {
            return Ok((m, None));
        }
        let cps = blobsnap::checkpoint::BlobCheckpointStore::new(
            Arc::clone(blob_store),
            blobsnap::layout::JobScope::new(job, job_id)?,
        );
        let latest = cps.latest(task).await?.ok_or_else(|| {
            Error::new(
                ErrorKind::NotFound,
                format!("task {task:?} of {job}/{job_id} has no checkpoint"),
            )
        })?;
        let m = latest
            .checkpoint
            .as_v2()
            .and_then(|c| c.marker(FACTORY_NAME, store))
            .map(str::to_string)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::NotFound,
                    format!(
                        "the latest checkpoint of task {task:?} has no snapshot of store {store:?}"
                    ),
                )
            })?;
        Ok((m, Some(latest)))
    }
}

/// The job deployment an admin command is about.
#[derive(Args)]
struct DeploymentArgs {
    /// The job's name.
    #[arg(long)]
    job: String,
    /// The job's id.
    #[arg(long, default_value = "1")]
    job_id: String,
    /// The deployment's id [job.deployment-id, default "default"].
    #[arg(long)]
    deployment: Option<String>,
}

#[derive(Subcommand)]
enum AdminAction {
    /// Create what the deployment needs: on S3 the bucket (if missing and allowed) and a
    /// lifecycle rule that aborts incomplete multipart uploads under the job's prefix (merged
    /// into the bucket's rules, never replacing them); then the owner record scope.json.
    Create {
        #[command(flatten)]
        d: DeploymentArgs,
        /// Record this as the job's sweep grace (`gc` refuses a shorter one unless forced)
        /// [job.gc-grace-secs].
        #[arg(long)]
        gc_grace_secs: Option<u64>,
    },
    /// Validate the deployment's resources: PUT/GET/LIST/DELETE a probe, a missing key
    /// answers 404 (not 403), the owner record names this deployment, and on S3 no
    /// expiration or transition rule covers the prefix. Exit 0 when all hold.
    Validate {
        #[command(flatten)]
        d: DeploymentArgs,
    },
}

#[derive(Subcommand)]
enum ShowAction {
    /// Read FILE (or `-` for stdin), validate, print normalized JSON on stdout.
    Show {
        /// The document, or `-` for standard input.
        file: String,
    },
}

/// Serve the metrics in Prometheus' text format at `http://<addr>/metrics` (port 0: any free
/// port) for as long as the process runs; returns the address bound, which the demo prints.
async fn serve_metrics(addr: std::net::SocketAddr) -> blobsnap::Result<std::net::SocketAddr> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| Error::new(ErrorKind::InvalidInput, format!("metrics recorder: {e}")))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::new(ErrorKind::Io, format!("metrics endpoint {addr}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::new(ErrorKind::Io, format!("metrics endpoint {addr}: {e}")))?;
    // The exporter's histograms are drained by its upkeep, which `install_recorder` leaves to
    // the caller.
    {
        let handle = handle.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                handle.run_upkeep();
            }
        });
    }
    // At most 16 scrapes at once, each with 10 s for its whole request head: a slow or
    // hostile client cannot hold the process's descriptors.
    let slots = Arc::new(tokio::sync::Semaphore::new(16));
    tokio::spawn(async move {
        loop {
            let (mut conn, _) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors, say: back off rather than spin.
                    tracing::warn!(error = %e, "metrics endpoint: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
                continue; // busy: drop the connection
            };
            let handle = handle.clone();
            tokio::spawn(async move {
                let _slot = slot;
                // One request per connection: read its head (bounded), answer, close.
                let mut head = Vec::with_capacity(1024);
                let mut buf = [0u8; 1024];
                let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
                while !head.windows(4).any(|w| w == b"\r\n\r\n")
                    && !head.windows(2).any(|w| w == b"\n\n")
                    && head.len() < 16 << 10
                {
                    match tokio::time::timeout_at(deadline, conn.read(&mut buf)).await {
                        Ok(Ok(n)) if n > 0 => head.extend_from_slice(&buf[..n]),
                        _ => return,
                    }
                }
                let line = String::from_utf8_lossy(&head);
                let ok = line.starts_with("GET /metrics ") || line.starts_with("GET / ");
                let (status, body) = if ok {
                    ("200 OK", handle.render())
                } else {
                    ("404 Not Found", "not found: try /metrics\n".to_string())
                };
                let reply = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(reply.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    Ok(bound)
}

/// Exit codes by error kind (clap uses 2 for usage errors).
fn exit_code(kind: ErrorKind) -> u8 {
    match kind {
        ErrorKind::NotFound => 3,
        ErrorKind::Corrupt => 4,
        ErrorKind::InvalidInput => 5,
        ErrorKind::Conflict => 6,
        ErrorKind::Transient => 7,
        ErrorKind::Permanent => 8,
        ErrorKind::Io => 9,
        ErrorKind::Cancelled => 10,
        _ => 1,
    }
}

fn read_input(file: &str) -> blobsnap::Result<Vec<u8>> {
    let mut buf = Vec::new();
    if file == "-" {
        std::io::stdin()
            .read_to_end(&mut buf)
            .map_err(|e| Error::new(ErrorKind::Io, format!("read stdin: {e}")))?;
    } else {
        buf = std::fs::read(file)
            .map_err(|e| Error::new(ErrorKind::Io, format!("read {file}: {e}")))?;
    }
    Ok(buf)
}

async fn open_store(args: &StoreArgs) -> blobsnap::Result<Arc<dyn BlobStore>> {
    store_settings(args)?.open_store().await
}

/// The admin of a job deployment on `store` (opened from `args`; `None`: the demo's default
/// local store): on S3 it also gets the raw client for the bucket and lifecycle calls.
async fn open_admin(
    args: Option<&StoreArgs>,
    store: Arc<dyn BlobStore>,
    job: &str,
    job_id: &str,
    deployment: &str,
) -> blobsnap::Result<blobsnap::blob::admin::BlobStoreAdmin> {
    let s3 = match args.map(store_settings).transpose()? {
        Some(st) if st.store.kind == StoreKind::S3 => {
            Some(blobsnap::blobstore::s3::S3Store::connect(st.s3.clone()).await?)
        }
        _ => None,
    };
    blobsnap::blob::admin::BlobStoreAdmin::new(store, s3, job, job_id, deployment)
}

/// `$XDG_CACHE_HOME/blobsnap`, else `~/.cache/blobsnap`, else a temp dir.
fn user_cache_dir() -> std::path::PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("blobsnap")
}

/// The settings file and environment, with the store flags on top.
fn store_settings(args: &StoreArgs) -> blobsnap::Result<Settings> {
    let mut settings = Settings::load(args.config.as_deref())?;
    if let Some(dir) = &args.local {
        settings.store.kind = StoreKind::Local;
        settings.store.local_dir = dir.clone();
    }
    if let Some(b) = &args.bucket {
        settings.store.kind = StoreKind::S3;
        settings.s3.bucket = b.clone();
    }
    if let Some(v) = &args.s3_endpoint {
        settings.s3.endpoint = Some(v.clone());
    }
    if let Some(v) = &args.s3_region {
        settings.s3.region = Some(v.clone());
    }
    if let Some(v) = &args.s3_prefix {
        settings.s3.prefix = v.clone();
    }
    if args.s3_path_style {
        settings.s3.path_style = true;
    }
    if settings.store.kind == StoreKind::Local && args.local.is_none() && args.config.is_none() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            "no blob store given: use --local DIR, --bucket B (S3), --config FILE or BLOBSNAP_STORE",
        ));
    }
    Ok(settings)
}

/// A progress bar on stderr, drawn only when stderr is a terminal (stdout carries `--json`).
/// `poll` returns (done, total) bytes; the bar stops when the returned guard is dropped.
struct Bar(Option<(tokio::task::JoinHandle<()>, indicatif::ProgressBar)>);

impl Bar {
    fn start(label: &str, poll: impl Fn() -> (u64, u64) + Send + 'static) -> Bar {
        if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            return Bar(None);
        }
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar.set_message(label.to_string());
        let drawn = bar.clone();
        let task = tokio::spawn(async move {
            loop {
                let (done, total) = poll();
                drawn.set_length(total);
                drawn.set_position(done);
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        });
        Bar(Some((task, bar)))
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        if let Some((task, bar)) = self.0.take() {
            task.abort();
            bar.finish_and_clear();
        }
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

async fn run(cli: Cli) -> blobsnap::Result<()> {
    match cli.command {
        Command::Demo {
            dir,
            partitions,
            lines,
            stores,
            commit_every,
            commit_ms,
            retention,
            unsafe_no_fencing,
            restore_fallback,
            gc_grace_secs,
            metrics_addr,
        } => {
            if let Some(addr) = metrics_addr {
                let bound = serve_metrics(addr).await?;
                eprintln!("demo: Prometheus metrics on http://{bound}/metrics");
            }
            use blobsnap::job::{wordcount, JobSettings};
            let job = Settings::load(cli.store.config.as_deref())?.job;
            let partitions = partitions.unwrap_or(job.partitions).max(1);
            let commit_every = commit_every.unwrap_or(job.commit_every);
            let commit_ms = commit_ms.unwrap_or(job.commit_ms);
            let retention = retention.unwrap_or(job.retention);
            let unsafe_no_fencing = unsafe_no_fencing || job.unsafe_no_fencing;
            let gc_grace_secs = gc_grace_secs.unwrap_or(job.gc_grace_secs);
            if gc_grace_secs < 60 {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!("job.gc-grace-secs = {gc_grace_secs}: a running job needs at least 60"),
                ));
            }
            let has_store_flags = cli.store.local.is_some()
                || cli.store.bucket.is_some()
                || cli.store.config.is_some()
                || std::env::var_os("BLOBSNAP_STORE").is_some();
            let blob_store: Arc<dyn BlobStore> = if has_store_flags {
                open_store(&cli.store).await?
            } else {
                Arc::new(RetryStore::new(
                    blobsnap::blobstore::counting::CountingStore::new(LocalStore::new(
                        dir.join("store"),
                    )?),
                    Default::default(),
                ))
            };
            let settings = JobSettings {
                job_name: job.name.clone(),
                job_id: job.id.clone(),
                state_dir: dir.join("state"),
                input_dir: dir.join("input"),
                stream: "lines".into(),
                stores,
                partitions,
                commit_every: commit_every.max(1),
                commit_interval: std::time::Duration::from_millis(commit_ms),
                retention,
                unsafe_no_fencing,
                commit_max_delay: std::time::Duration::from_millis(job.commit_max_delay_ms),
                sweep_every_commits: job.sweep_every_commits,
                gc_grace: std::time::Duration::from_secs(gc_grace_secs),
                restore_fallback: restore_fallback || job.restore_fallback,
                deployment_id: job.deployment_id.clone(),
                create_resources: job.create_resources,
            };
            let admin = open_admin(
                has_store_flags.then_some(&cli.store),
                Arc::clone(&blob_store),
                &settings.job_name,
                &settings.job_id,
                &settings.deployment_id,
            )
            .await?
            .with_gc_grace(settings.gc_grace);
            wordcount::generate_input(&settings.input_dir, partitions, lines, 42)?;
            eprintln!(
                "demo: {partitions} partitions x {lines} lines in {}, blob store {blob_store}",
                settings.input_dir.display()
            );
            let json = cli.json;
            let on_commit: Arc<blobsnap::job::CommitObserver> = Arc::new(
                move |task, report, backup| {
                    if json {
                        return;
                    }
                    let s = backup
                        .last_upload_stats()
                        .get("counts")
                        .copied()
                        .unwrap_or_default();
                    println!(
                    "{task:<12} checkpoint {} (#{}): uploaded {} files / {:.2} MiB, reused {} files / {:.2} MiB, {} ms",
                    report.checkpoint.id,
                    report.seq,
                    s.blobs_uploaded,
                    mib(s.bytes_uploaded),
                    s.files_retained + s.blobs_deduplicated,
                    mib(s.bytes - s.bytes_uploaded),
                    report.sync_ms + report.upload_ms + report.write_ms + report.cleanup_ms
                );
                },
            );
            let clock: Arc<dyn blobsnap::backend::Clock> = Arc::new(blobsnap::backend::SystemClock);
            let summaries = wordcount::run(&settings, blob_store, &admin, clock, on_commit).await?;
            let stored = wordcount::count_stores(&settings.state_dir, partitions)?;
            let expected = wordcount::count_input(&settings.input_dir, partitions)?;
            let ok = stored == expected;
            let mut top: Vec<(&String, &u64)> = stored.iter().collect();
            top.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            let total: u64 = stored.values().sum();
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "schema": 1,
                        "tasks": summaries.iter().map(|s| serde_json::json!({
                            "task": s.task, "resumed-from": s.resumed_from,
                            "processed": s.processed, "commits": s.commits.len(),
                            "commits-skipped": s.commits_skipped, "commits-failed": s.commits_failed,
                            "sweeps": s.sweeps, "swept": s.swept,
                            "fell-back-to": s.fell_back_to,
                        })).collect::<Vec<_>>(),
                        "words": stored.len(),
                        "total": total,
                        "check": if ok { "ok" } else { "mismatch" },
                    })
                );
            } else {
                for s in &summaries {
                    println!(
                        "{}: resumed from offset {}, processed {} messages, {} commits ({} skipped while one was in flight, {} failed and retried), {} sweeps",
                        s.task,
                        s.resumed_from,
                        s.processed,
                        s.commits.len(),
                        s.commits_skipped,
                        s.commits_failed,
                        s.sweeps
                    );
                    if let Some(f) = &s.fell_back_to {
                        println!(
                            "{}: RESTORE FALLBACK: the last checkpoint did not restore; restored {f}",
                            s.task
                        );
                    }
                }
                println!("top words:");
                for (w, n) in top.iter().take(10) {
                    println!("  {n:>8}  {w}");
                }
                println!(
                    "check: {total} words in the stores {} an independent count of the input",
                    if ok { "equal" } else { "DIFFER FROM" }
                );
            }
            if !ok {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    "the stored counts differ from the input: state and offsets were not committed together",
                ));
            }
        }
        Command::Probe => {
            let settings = store_settings(&cli.store)?;
            if settings.store.kind != StoreKind::S3 {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    "probe asks an S3 server: give --bucket (the local store's capabilities are fixed: create-only via link(2) is atomic)",
                ));
            }
            let store = blobsnap::blobstore::s3::S3Store::connect(settings.s3.clone()).await?;
            let report = store.probe().await?;
            if cli.json {
                println!(
                    "{}",
                    serde_json::json!({ "schema": 1, "store": store.to_string(), "probe": report })
                );
            } else {
                let c = &report.create_only;
                println!("store: {store}");
                println!(
                    "create-only puts: {} ({} concurrent writers per round, winners per round {:?}{})",
                    c.verdict,
                    blobsnap::blobstore::s3::PROBE_WRITERS,
                    c.winners_per_round,
                    match c.sequential_refused {
                        Some(true) => "; a sequential second put is refused",
                        Some(false) => "; a second put silently overwrites",
                        None => "",
                    }
                );
                if c.verdict != "atomic" {
                    println!(
                        "  -> no fence: a job refuses to run here unless unsafe_no_fencing is set (one writer per task guaranteed by other means)"
                    );
                }
                println!("sha256 verified on put: {}", report.verifies_sha256);
                println!("crc32c verified on put: {}", report.verifies_crc32c);
                println!("multipart listing: {}", report.multipart_listing);
                println!("object tagging: {}", report.tagging);
                println!("lifecycle rules: {}", report.lifecycle);
                println!(
                    "\n[s3] settings for this server:\n{}",
                    report.settings_toml()
                );
            }
        }
        Command::Gc {
            job,
            job_id,
            task,
            store,
            grace_secs,
            dry_run,
            force,
        } => {
            use blobsnap::blob::{admin, gc};
            let blob_store = open_store(&cli.store).await?;
            {
                // A grace under the job's is refused unless forced, and while a task of the
                // job runs even then (a dry run deletes nothing: it only warns).
                let scope = blobsnap::layout::JobScope::new(&job, &job_id)?;
                let record = admin::read_scope_record(blob_store.as_ref(), &scope).await?;
                let active = admin::active_writers(
                    blob_store.as_ref(),
                    &scope,
                    std::time::SystemTime::now(),
                )
                .await?;
                match admin::sweep_guard(
                    std::time::Duration::from_secs(grace_secs),
                    record.as_ref(),
                    &active,
                    force,
                ) {
                    Err(e) if dry_run => eprintln!("gc: a real run would be refused: {e}"),
                    r => r?,
                }
            }
            let settings = gc::SweepSettings {
                job_name: job,
                job_id,
                task,
                store,
                grace: std::time::Duration::from_secs(grace_secs),
            };
            // A dry run writes nothing: not even the probe that reads the server's clock.
            let plan = if dry_run {
                gc::plan_sweep_read_only(&blob_store, &settings).await?
            } else {
                gc::plan_sweep(&blob_store, &settings).await?
            };
            let deleted = if dry_run {
                0
            } else {
                let total = plan.bytes;
                let freed = Arc::new(std::sync::atomic::AtomicU64::new(0));
                let f = Arc::clone(&freed);
                let bar = Bar::start("gc", move || {
                    (f.load(std::sync::atomic::Ordering::Relaxed), total)
                });
                let n = gc::execute_sweep_with_progress(blob_store.as_ref(), &plan, &freed).await?;
                drop(bar);
                n
            };
            if cli.json {
                println!(
                    "{}",
                    serde_json::json!({"schema": 1, "dry-run": dry_run, "plan": plan, "deleted": deleted})
                );
            } else {
                println!(
                    "sweep of {}/{}: {} roots, {} live objects; {} objects ({} bytes) to delete, {} kept (younger than the grace), {} unknown keys, {} stale uploads",
                    settings.job_name,
                    settings.job_id,
                    plan.roots,
                    plan.live,
                    plan.delete.len(),
                    plan.bytes,
                    plan.kept_young,
                    plan.unknown.len(),
                    plan.uploads.len()
                );
                for d in &plan.delete {
                    println!("  delete {:>12}  {}", d.size, d.key);
                }
                for u in &plan.unknown {
                    println!("  unknown (kept)  {u}");
                }
                if dry_run {
                    println!("dry run: nothing deleted");
                } else {
                    println!("deleted {deleted} objects, freed {} bytes", plan.bytes);
                }
            }
        }
        Command::Admin { action } => {
            use blobsnap::backend::StateBackendAdmin as _;
            let blob_store = open_store(&cli.store).await?;
            let settings = store_settings(&cli.store)?;
            let (d, grace, create) = match &action {
                AdminAction::Create { d, gc_grace_secs } => (
                    d,
                    Some(gc_grace_secs.unwrap_or(settings.job.gc_grace_secs)),
                    true,
                ),
                AdminAction::Validate { d } => (d, None, false),
            };
            let deployment = d
                .deployment
                .clone()
                .unwrap_or_else(|| settings.job.deployment_id.clone());
            let mut adm = open_admin(
                Some(&cli.store),
                Arc::clone(&blob_store),
                &d.job,
                &d.job_id,
                &deployment,
            )
            .await?;
            if let Some(g) = grace {
                adm = adm.with_gc_grace(std::time::Duration::from_secs(g));
            }
            if create {
                adm.create_resources().await?;
            }
            adm.validate_resources().await?;
            let what = if create { "created and valid" } else { "valid" };
            if cli.json {
                println!(
                    "{}",
                    serde_json::json!({"schema": 1, "job": d.job, "job-id": d.job_id, "deployment": deployment, "store": blob_store.to_string(), "result": what})
                );
            } else {
                println!(
                    "{}/{} (deployment {deployment:?}) on {blob_store}: {what}",
                    d.job, d.job_id
                );
            }
        }
        Command::Backup { db, name } => {
            backup_command(&cli.store, cli.json, &db, &name).await?;
        }
        Command::Ls => {
            ls_command(&cli.store, cli.json).await?;
        }
        Command::Inspect { snap, marker } => {
            let blob_store = open_store(&cli.store).await?;
            let (marker, checkpoint) = snap.resolve_marker(&blob_store, marker).await?;
            if let (Some(c), false) = (&checkpoint, cli.json) {
                println!(
                    "checkpoint #{} of task {} (writer {}):",
                    c.seq, snap.task, c.writer
                );
                println!("  {}", String::from_utf8_lossy(&c.checkpoint.to_json()?));
            }
            let (_, m, index) = snap.load(blob_store.as_ref(), &marker).await?;
            let own = format!("blobs/{}/", m.checkpoint_id);
            let files = index.present_files();
            let bytes: u64 = files.iter().map(|(_, f)| f.file_metadata.size).sum();
            let uploaded: Vec<_> = files
                .iter()
                .filter(|(_, f)| f.blobs.iter().any(|b| b.blob_id.starts_with(&own)))
                .collect();
            let up_bytes: u64 = uploaded.iter().map(|(_, f)| f.file_metadata.size).sum();
            if cli.json {
                let checkpoint = match &checkpoint {
                    Some(c) => serde_json::json!({
                        "seq": c.seq,
                        "writer": c.writer,
                        "document": serde_json::from_slice::<serde_json::Value>(&c.checkpoint.to_json()?)
                            .map_err(|e| Error::new(ErrorKind::Corrupt, format!("checkpoint JSON: {e}")))?,
                    }),
                    None => serde_json::Value::Null,
                };
                println!(
                    "{}",
                    serde_json::json!({
                        "schema": 1,
                        "marker": marker,
                        "checkpoint": checkpoint,
                        "checkpoint-id": m.checkpoint_id.to_string(),
                        "prev": index.prev_snapshot_index_blob_id,
                        "files": files.iter().map(|(p, f)| serde_json::json!({
                            "path": p, "size": f.file_metadata.size,
                            "sha256": f.sha256.map(|s| s.to_hex()),
                            "blob": f.blobs.first().map(|b| b.blob_id.clone()),
                        })).collect::<Vec<_>>(),
                        "total-files": files.len(),
                        "total-bytes": bytes,
                        "uploaded-files": uploaded.len(),
                        "uploaded-bytes": up_bytes,
                        "upload-requests": uploaded.len() + 1,
                        "restore-requests": files.len() + 1,
                        "restore-bytes": bytes,
                    })
                );
            } else {
                let md = &index.snapshot_metadata;
                println!(
                    "snapshot {marker}\n  job {} / {}, task {}, store {}, checkpoint {}",
                    md.job_name, md.job_id, md.task_name, md.store_name, md.checkpoint_id
                );
                println!(
                    "  previous: {}",
                    index
                        .prev_snapshot_index_blob_id
                        .as_deref()
                        .unwrap_or("(none)")
                );
                for (p, f) in &files {
                    let blob = f.blobs.first().map(|b| b.blob_id.as_str()).unwrap_or("-");
                    let new = if blob.starts_with(&own) {
                        "new"
                    } else {
                        "reused"
                    };
                    println!("  {:>12}  {p}  {new} {blob}", f.file_metadata.size);
                }
                println!(
                    "  {} files, {} bytes; uploaded by this checkpoint: {} files, {} bytes, about {} requests (single PUTs + the index); a restore into an empty dir: {} GETs, {} bytes",
                    files.len(),
                    bytes,
                    uploaded.len(),
                    up_bytes,
                    uploaded.len() + 1,
                    files.len() + 1,
                    bytes
                );
            }
        }
        Command::Diff { snap, a, b } => {
            let blob_store = open_store(&cli.store).await?;
            let (_, _, ia) = snap.load(blob_store.as_ref(), &a).await?;
            let (_, _, ib) = snap.load(blob_store.as_ref(), &b).await?;
            let fa: std::collections::BTreeMap<String, (Option<blobsnap::digest::Sha256>, u64)> =
                ia.present_files()
                    .into_iter()
                    .map(|(p, f)| (p, (f.sha256, f.file_metadata.size)))
                    .collect();
            let fb: std::collections::BTreeMap<String, (Option<blobsnap::digest::Sha256>, u64)> =
                ib.present_files()
                    .into_iter()
                    .map(|(p, f)| (p, (f.sha256, f.file_metadata.size)))
                    .collect();
            let mut rows = Vec::new();
            let (mut added, mut removed, mut changed, mut retained) =
                ((0u64, 0u64), (0u64, 0u64), (0u64, 0u64), (0u64, 0u64));
            for (p, (sha, size)) in &fb {
                match fa.get(p) {
                    None => {
                        added.0 += 1;
                        added.1 += size;
                        rows.push(("added", p.clone(), *size));
                    }
                    Some((sa, _)) if sa == sha && sha.is_some() => {
                        retained.0 += 1;
                        retained.1 += size;
                    }
                    Some(_) => {
                        changed.0 += 1;
                        changed.1 += size;
                        rows.push(("changed", p.clone(), *size));
                    }
                }
            }
            for (p, (_, size)) in &fa {
                if !fb.contains_key(p) {
                    removed.0 += 1;
                    removed.1 += size;
                    rows.push(("removed", p.clone(), *size));
                }
            }
            if cli.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "schema": 1,
                        "added": {"files": added.0, "bytes": added.1},
                        "removed": {"files": removed.0, "bytes": removed.1},
                        "changed": {"files": changed.0, "bytes": changed.1},
                        "retained": {"files": retained.0, "bytes": retained.1},
                        "entries": rows.iter().map(|(k, p, s)| serde_json::json!({"change": k, "path": p, "size": s})).collect::<Vec<_>>(),
                    })
                );
            } else {
                for (k, p, size) in &rows {
                    println!("  {k:<8} {size:>12}  {p}");
                }
                println!(
                    "added {} files ({} bytes), removed {} ({} bytes), changed {} ({} bytes), retained {} ({} bytes)",
                    added.0, added.1, removed.0, removed.1, changed.0, changed.1, retained.0, retained.1
                );
            }
        }
        Command::Verify {
            snap,
            marker,
            deep,
            sample,
        } => {
            if !(sample > 0.0 && sample <= 100.0) {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!("--sample {sample}: a percentage in (0, 100]"),
                ));
            }
            if sample < 100.0 && !deep {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    "--sample chooses blobs to download: it needs --deep",
                ));
            }
            let blob_store = open_store(&cli.store).await?;
            let (marker, _) = snap.resolve_marker(&blob_store, marker).await?;
            let (scope, _, index) = snap.load(blob_store.as_ref(), &marker).await?;
            // --sample: exactly ceil(objects × pct / 100) blobs, chosen at random.
            let objects: usize = index
                .present_files()
                .iter()
                .map(|(_, f)| f.blobs.len())
                .sum();
            let chosen: std::collections::HashSet<usize> = if sample >= 100.0 {
                (0..objects).collect()
            } else {
                let k = ((objects as f64 * sample / 100.0).ceil() as usize).min(objects);
                rand::seq::index::sample(&mut rand::rng(), objects, k)
                    .into_iter()
                    .collect()
            };
            let mut problems: Vec<(ErrorKind, String)> = Vec::new();
            let total_bytes: u64 = index
                .present_files()
                .iter()
                .map(|(_, f)| f.file_metadata.size)
                .sum();
            let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let bar = deep.then(|| {
                let done = Arc::clone(&done);
                Bar::start("verify", move || {
                    (done.load(std::sync::atomic::Ordering::Relaxed), total_bytes)
                })
            });
            let mut checked = 0u64;
            let mut deep_checked = 0u64;
            for (path, f) in index.present_files() {
                for b in &f.blobs {
                    let key = scope.key(&b.blob_id)?;
                    checked += 1;
                    match blob_store.head(&key).await {
                        Ok(meta) if meta.size != f.file_metadata.size => problems.push((
                            ErrorKind::Corrupt,
                            format!(
                                "{path}: blob {key} is {} bytes, the index says {}",
                                meta.size, f.file_metadata.size
                            ),
                        )),
                        Ok(_) => {
                            done.fetch_add(
                                f.file_metadata.size,
                                std::sync::atomic::Ordering::Relaxed,
                            );
                            if deep && chosen.contains(&(checked as usize - 1)) {
                                deep_checked += 1;
                                match blobsnap::blob::hash_object(blob_store.as_ref(), &key).await {
                                    Ok((sha, _)) if Some(sha) != f.sha256 => problems.push((
                                        ErrorKind::Corrupt,
                                        format!("{path}: blob {key} has SHA-256 {sha}, the index says {}", f.sha256.map(|s| s.to_hex()).unwrap_or_default()),
                                    )),
                                    Ok(_) => {}
                                    Err(e) => problems.push((e.kind(), format!("{path}: {e}"))),
                                }
                            }
                        }
                        Err(e) => problems.push((e.kind(), format!("{path}: blob {key}: {e}"))),
                    }
                }
            }
            drop(bar);
            if cli.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "schema": 1, "marker": marker, "objects": checked, "deep-checked": deep_checked,
                        "problems": problems.iter().map(|(k, m)| serde_json::json!({"kind": k.as_str(), "message": m})).collect::<Vec<_>>(),
                    })
                );
            } else {
                for (k, m) in &problems {
                    println!("  {k}: {m}");
                }
                println!(
                    "verified {checked} objects ({deep_checked} downloaded and hashed): {} problems",
                    problems.len()
                );
            }
            // Missing beats corrupt beats anything else, for the exit code.
            if let Some(kind) = [ErrorKind::NotFound, ErrorKind::Corrupt]
                .into_iter()
                .find(|k| problems.iter().any(|(p, _)| p == k))
                .or_else(|| problems.first().map(|(k, _)| *k))
            {
                return Err(Error::new(
                    kind,
                    format!(
                        "snapshot {marker} failed verification ({} problems)",
                        problems.len()
                    ),
                ));
            }
        }
        Command::Checkpoint {
            action: ShowAction::Show { file },
        } => {
            let cp = Checkpoint::from_json(&read_input(&file)?)?;
            println!("{}", String::from_utf8_lossy(&cp.to_json()?));
        }
        Command::Index {
            action: ShowAction::Show { file },
        } => {
            let index = blobsnap::index::SnapshotIndex::from_slice(&read_input(&file)?)?;
            println!("{}", String::from_utf8_lossy(&index.to_bytes()?));
        }
        Command::Restore {
            marker,
            snap,
            to,
            dry_run,
            force,
        } => {
            refuse_foreign_dir(&to, force)?;
            let blob_store = open_store(&cli.store).await?;
            let (marker, _) = snap.resolve_marker(&blob_store, marker).await?;
            let SnapshotArgs {
                job,
                job_id,
                task,
                store,
            } = snap;
            let parsed: IndexMarker = marker.parse()?;
            let ctx = TaskContext {
                job_name: job,
                job_id,
                task_name: task,
            };
            let spec = StoreSpec {
                name: store.clone(),
                dir: to,
            };
            // Nobody else may restore into the dir or have its database open meanwhile.
            let _lock = blobsnap::local::lock::StoreDirLock::acquire(&spec.dir)?;
            let mgr = BlobRestoreManager::new(
                blob_store,
                ctx,
                std::slice::from_ref(&spec),
                RestoreSettings::default(),
            )?;
            let checkpoint = Checkpoint::V2(CheckpointV2 {
                id: parsed.checkpoint_id,
                input_offsets: Default::default(),
                state_checkpoint_markers: [(
                    FACTORY_NAME.to_string(),
                    [(store.clone(), marker.clone())].into(),
                )]
                .into(),
            });
            mgr.init(Some(&checkpoint)).await?;
            // The plan printed is the plan carried out: an interrupted earlier restore is
            // finished first (a dry run changes nothing, so it plans the dir as it is).
            if !dry_run {
                mgr.recover().await?;
            }
            let plans = mgr.plan().await?;
            if !cli.json {
                for p in &plans {
                    print!("{p}");
                }
            }
            if dry_run {
                if cli.json {
                    let totals: Vec<_> = plans.iter().map(|p| (&p.store, p.totals)).collect();
                    println!(
                        "{}",
                        serde_json::json!({"schema": 1, "dry-run": true, "plans": totals})
                    );
                }
                return Ok(());
            }
            let bar = mgr.progress(&store).map(|p| {
                Bar::start("restore", move || {
                    use std::sync::atomic::Ordering::Relaxed;
                    (
                        p.bytes_fetched.load(Relaxed),
                        p.bytes_to_fetch.load(Relaxed),
                    )
                })
            });
            mgr.execute(plans).await?;
            drop(bar);
            let totals = mgr.plan_totals();
            let progress = mgr.progress(&store);
            let fetched = progress
                .as_ref()
                .map(|p| p.bytes_fetched.load(std::sync::atomic::Ordering::Relaxed))
                .unwrap_or(0);
            if cli.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "schema": 1,
                        "store": store,
                        "marker": marker,
                        "plan": totals.get(&store),
                        "bytes-fetched": fetched,
                        "bytes-hashed": blobsnap::digest::bytes_hashed(),
                    })
                );
            } else {
                println!("restored {store} from {marker}: {fetched} bytes downloaded");
            }
        }
    }
    Ok(())
}

/// `restore --to DIR` replaces DIR's contents: a non-empty DIR that is not a store blobsnap
/// restored (its `RESTORED` marker) is someone's data, refused unless `--force`. A symlink as
/// DIR is refused too (a restore never follows one out of the place it was given).
fn refuse_foreign_dir(dir: &std::path::Path, force: bool) -> blobsnap::Result<()> {
    let md = match std::fs::symlink_metadata(dir) {
        Ok(md) => md,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(Error::new(
                ErrorKind::Io,
                format!("stat {}: {e}", dir.display()),
            ))
        }
    };
    if !md.is_dir() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "--to {} is not a directory (a symlink or a file): nothing restored",
                dir.display()
            ),
        ));
    }
    if force || dir.join(blobsnap::index::RESTORED_MARKER).is_file() {
        return Ok(());
    }
    let mut entries = std::fs::read_dir(dir)
        .map_err(|e| Error::new(ErrorKind::Io, format!("list {}: {e}", dir.display())))?;
    if entries.next().is_some() {
        return Err(Error::new(ErrorKind::InvalidInput, format!(
            "--to {} is not empty and blobsnap did not restore it (no RESTORED marker): its files would be replaced; give --force to do that, or restore into an empty or new directory",
            dir.display()
        )));
    }
    Ok(())
}

/// `blobsnap backup`: manual backups are a job named `manual` whose id is the backup's name,
/// with one task (`backup`) and one store (`db`), so the layout, restore and the sweep apply
/// unchanged.
async fn backup_command(
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
            "backup {name}: {} files, {} bytes; uploaded {} files, {} bytes. Restore with: blobsnap restore {marker} --job manual --job-id {name} --task backup --store db --to DIR",
            s.files, s.bytes, s.blobs_uploaded, s.bytes_uploaded
        );
    }
    Ok(())
}

/// `blobsnap ls`: one listing of the store, grouped by job, task and store.
async fn ls_command(args: &StoreArgs, json: bool) -> blobsnap::Result<()> {
    use futures::TryStreamExt as _;
    let blob_store = open_store(args).await?;
    let all: Vec<_> = blob_store
        .list(&blobsnap::blobstore::Scope::root())
        .try_collect()
        .await?;
    #[derive(Default, serde::Serialize)]
    struct StoreInfo {
        snapshots: u64,
        blobs: u64,
        bytes: u64,
        newest: Option<String>,
    }
    #[derive(Default, serde::Serialize)]
    struct TaskInfo {
        checkpoints: u64,
        latest_seq: u64,
        /// Seconds since the latest checkpoint was written (by the store's clock).
        latest_age_secs: Option<u64>,
        stores: std::collections::BTreeMap<String, StoreInfo>,
    }
    let mut jobs: std::collections::BTreeMap<String, std::collections::BTreeMap<String, TaskInfo>> =
        Default::default();
    let un = |s: &str| blobsnap::blobstore::unescape_segment(s).unwrap_or_else(|_| s.to_string());
    for m in &all {
        let parts: Vec<&str> = m.key.as_str().split('/').collect();
        if parts.len() < 4 {
            continue;
        }
        let job = format!("{}/{}", un(parts[0]), un(parts[1]));
        match &parts[2..] {
            ["checkpoints", task, file] => {
                let t = jobs.entry(job).or_default().entry(un(task)).or_default();
                t.checkpoints += 1;
                if let Some(seq) = file
                    .strip_suffix(".json")
                    .and_then(|f| f.parse::<u64>().ok())
                {
                    if seq >= t.latest_seq {
                        t.latest_seq = seq;
                        #[allow(clippy::disallowed_methods)]
                        let now = std::time::SystemTime::now();
                        t.latest_age_secs = m
                            .last_modified
                            .and_then(|lm| now.duration_since(lm).ok())
                            .map(|d| d.as_secs());
                    }
                }
            }
            ["tasks", task, "stores", store, kind, rest @ ..] => {
                let t = jobs.entry(job).or_default().entry(un(task)).or_default();
                let s = t.stores.entry(un(store)).or_default();
                match *kind {
                    "index" => {
                        s.snapshots += 1;
                        // Newest by checkpoint id (never by the key's text: "…-10" sorts
                        // before "…-9"); a key that is no marker is counted, not ranked.
                        let marker = format!("index/{}", rest.join("/"));
                        if let Ok(m) = marker.parse::<IndexMarker>() {
                            let newer = s.newest.as_ref().is_none_or(|n| {
                                n.parse::<IndexMarker>()
                                    .map_or(true, |n| n.checkpoint_id < m.checkpoint_id)
                            });
                            if newer {
                                s.newest = Some(marker);
                            }
                        }
                    }
                    "blobs" => {
                        s.blobs += 1;
                        s.bytes += m.size;
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
    if json {
        println!("{}", serde_json::json!({"schema": 1, "jobs": jobs}));
        return Ok(());
    }
    for (job, tasks) in &jobs {
        println!("{job}");
        for (task, t) in tasks {
            let age = t
                .latest_age_secs
                .map(|a| format!(", {}h{:02}m{:02}s ago", a / 3600, a / 60 % 60, a % 60))
                .unwrap_or_default();
            println!(
                "  task {task}: {} checkpoints, latest #{}{age}",
                t.checkpoints, t.latest_seq
            );
            for (store, s) in &t.stores {
                println!(
                    "    store {store}: {} snapshots, {} blobs, {} bytes; newest {}",
                    s.snapshots,
                    s.blobs,
                    s.bytes,
                    s.newest.as_deref().unwrap_or("-")
                );
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    // Credentials in the environment are scrubbed from every log line and message.
    blobsnap::redact::register_env();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(blobsnap::redact::RedactingWriter::new(std::io::stderr))
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    if let Err(e) = blobsnap::crash::check_env() {
        eprintln!("blobsnap: {e}");
        return ExitCode::from(exit_code(e.kind()));
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("blobsnap: cannot start the async runtime: {e}");
            return ExitCode::from(9);
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("blobsnap: {}", blobsnap::redact::scrub(&e.to_string()));
            ExitCode::from(exit_code(e.kind()))
        }
    }
}
