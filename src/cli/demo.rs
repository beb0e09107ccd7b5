//! `blobsnap demo`: the word-count job on RocksDB, backed up at every commit.

use std::path::PathBuf;
use std::sync::Arc;

use super::args::{open_admin, open_demo_store, StoreArgs};
use super::progress::mib;
use blobsnap::config::Settings;
use blobsnap::{Error, ErrorKind};
use clap::Args;

#[derive(Args)]
pub(crate) struct DemoArgs {
    /// Where the input, the state and (by default) the blob store live.
    #[arg(long, default_value = "blobsnap-demo")]
    pub(crate) dir: PathBuf,
    /// Partitions (= tasks) [settings: job.partitions, default 4].
    #[arg(long)]
    pub(crate) partitions: Option<u32>,
    /// Lines of input per partition.
    #[arg(long, default_value_t = 20_000)]
    pub(crate) lines: u64,
    /// The stores of each task, comma-separated: `counts` (required) and optionally
    /// `lengths`. Adding a store to a job that already committed starts it empty.
    #[arg(long, default_value = "counts", value_delimiter = ',')]
    pub(crate) stores: Vec<String>,
    /// Commit every this many messages [job.commit-every, default 2500].
    #[arg(long)]
    pub(crate) commit_every: Option<u64>,
    /// Also commit every this many milliseconds [job.commit-ms, default 0: off].
    #[arg(long)]
    pub(crate) commit_ms: Option<u64>,
    /// What the history keeps: a count of the newest checkpoints, or rules such as "last 3,
    /// every 5m for 1d, every 1h for 7d" (the union is kept) [job.retention, default 2].
    #[arg(long)]
    pub(crate) retention: Option<blobsnap::retention::RetentionPolicy>,
    /// Run on a store that cannot fence a second writer (Garage, s3s-fs).
    #[arg(long)]
    pub(crate) unsafe_no_fencing: bool,
    /// If the last checkpoint's snapshot is corrupt or missing, restore the newest
    /// retained checkpoint that restores and resume from its offsets (logged loudly,
    /// counted in blobsnap_restore_fallbacks_total) [job.restore-fallback].
    #[arg(long)]
    pub(crate) restore_fallback: bool,
    /// How a restarted task restores its stores: "full" (every file verified before the
    /// store opens) or "lazy" (the store opens at once; SSTs are fetched on first use and in
    /// the background) [job.restore-mode, default full].
    #[arg(long)]
    pub(crate) restore_mode: Option<blobsnap::job::RestoreMode>,
    /// Serve Prometheus metrics on this address while the demo runs (`127.0.0.1:9898`;
    /// port 0 picks a free one). The address bound is printed on stderr.
    #[arg(long)]
    pub(crate) metrics_addr: Option<std::net::SocketAddr>,
    /// Grace period of the sweep the tasks run every 20 commits, in seconds (at least 60:
    /// an upload running longer than half of it is abandoned) [job.gc-grace-secs].
    #[arg(long, value_parser = blobsnap::units::parse_secs)]
    pub(crate) gc_grace_secs: Option<u64>,
    /// Start every task from this point instead of its latest checkpoint — a rollback, or a
    /// roll-forward to a newer retained one: `savepoint:NAME`, `@2026-12-02T10:00Z` (each
    /// task's newest at or before it), `#N` (each task's own number N: tasks' numbers diverge
    /// after restarts), a checkpoint id or prefix. Each task commits the point as its new head
    /// (the history records the move) and reprocesses from its offsets; applied once (a rerun
    /// with the same value resumes from the latest) [job.start-from]. `savepoint:JOB/JOB-ID/NAME` names another
    /// job's savepoint: this job starts as a **fork** of it, borrowing its blobs (none copied).
    #[arg(long)]
    pub(crate) start_from: Option<String>,
    /// Apply --start-from again, once, under this id (a date, a ticket): a point is applied
    /// once per id, so a second rollback to the same point takes a new one, and a restart
    /// with the same id resumes from the latest [job.start-from-id].
    #[arg(long)]
    pub(crate) start_from_id: Option<String>,
    /// The job's name [job.name, default wordcount].
    #[arg(long)]
    pub(crate) job_name: Option<String>,
    /// The job's id [job.id, default 1]: another id is another deployment, with its own
    /// checkpoints and blobs (a fork, with --start-from savepoint:JOB/JOB-ID/NAME).
    #[arg(long)]
    pub(crate) job_id: Option<String>,
}

pub(crate) async fn run(
    store_args: &StoreArgs,
    json: bool,
    args: DemoArgs,
) -> blobsnap::Result<()> {
    let DemoArgs {
        dir,
        partitions,
        lines,
        stores,
        commit_every,
        commit_ms,
        retention,
        unsafe_no_fencing,
        restore_fallback,
        restore_mode,
        metrics_addr,
        gc_grace_secs,
        start_from,
        start_from_id,
        job_name,
        job_id,
    } = args;
    if let Some(addr) = metrics_addr {
        let bound = serve_metrics(addr).await?;
        eprintln!("demo: Prometheus metrics on http://{bound}/metrics");
    }
    use blobsnap::job::{wordcount, JobSettings};
    let loaded = Settings::load(store_args.config.as_deref())?;
    let job = loaded.job;
    let partitions = partitions.unwrap_or(job.partitions).max(1);
    let commit_every = commit_every.unwrap_or(job.commit_every);
    let commit_ms = commit_ms.unwrap_or(job.commit_ms);
    let retention = retention.unwrap_or(job.retention.clone());
    let unsafe_no_fencing = unsafe_no_fencing || job.unsafe_no_fencing;
    let gc_grace_secs = gc_grace_secs.unwrap_or(job.gc_grace_secs);
    if gc_grace_secs < 60 {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("job.gc-grace-secs = {gc_grace_secs}: a running job needs at least 60"),
        ));
    }
    let has_store_flags = store_args.names_a_store();
    // The tasks replace their store dirs under DIR/state by restores: never the blob store
    // in use, the home, the current dir or a dir holding one of them.
    blobsnap::local::guard::refuse_special(
        "--dir's state dir",
        &dir.join("state"),
        &super::args::protected_store(store_args, Some(&dir)),
    )?;
    // One demo per --dir: its tasks lock their store dirs one by one, so two demos started
    // together could each take one partition and both fail; this takes the whole dir first.
    // What this run makes (and may take back on a refusal below): never what was there.
    let made = [dir.join("input"), dir.join("state"), dir.clone()].map(|d| !d.exists());
    let dir_lock = blobsnap::local::lock::StoreDirLock::at(
        &dir.join(".blobsnap-demo.lock"),
        &format!("demo dir {}", dir.display()),
    )?;
    let blob_store = open_demo_store(store_args, &dir).await?;
    let settings = JobSettings {
        job_name: job_name.unwrap_or(job.name.clone()),
        job_id: job_id.unwrap_or(job.id.clone()),
        state_dir: dir.join("state"),
        input_dir: dir.join("input"),
        stream: "lines".into(),
        stores,
        partitions,
        commit_every: commit_every.max(1),
        commit_interval: std::time::Duration::from_millis(commit_ms),
        retention: retention.last,
        retention_tiers: retention.tiers.clone(),
        unsafe_no_fencing,
        commit_max_delay: std::time::Duration::from_millis(job.commit_max_delay_ms),
        sweep_every_commits: job.sweep_every_commits,
        gc_grace: std::time::Duration::from_secs(gc_grace_secs),
        restore_fallback: restore_fallback || job.restore_fallback,
        deployment_id: job.deployment_id.clone(),
        create_resources: job.create_resources,
        index_inline_below: job.index_inline_below,
        restore_mode: restore_mode.unwrap_or(job.restore_mode),
        lazy_download_rate: job.lazy_download_rate,
        pre_upload: loaded.store.pre_upload,
        start_from: match start_from.or(job.start_from.clone()) {
            Some(p) => Some(p.parse()?),
            None => None,
        },
        start_from_id: start_from_id.or(job.start_from_id.clone()),
        stop: super::signal::stop_on_signal(
            "each task commits what it processed, deletes its lease and releases its stores",
        ),
    };
    let admin = open_admin(
        has_store_flags.then_some(store_args),
        Arc::clone(&blob_store),
        &settings.job_name,
        &settings.job_id,
        &settings.deployment_id,
    )
    .await?
    .with_gc_grace(settings.gc_grace);
    // A point every task can start from, and an input that still holds what the job
    // committed, before the input is written (a refused run leaves it as it was).
    if let Err(e) = blobsnap::job::check_start_from(&settings, &blob_store).await {
        if e.kind() != ErrorKind::NotFound {
            return Err(e);
        }
        // The runs' shape is the cause only when the store lacks a task of this run (a
        // store every task of which has a history has the right --dir and --partitions: the
        // point is what is missing, and the error says why).
        let job = blobsnap::layout::JobScope::new(&settings.job_name, &settings.job_id)?;
        let stored = blobsnap::blob::history::task_names(blob_store.as_ref(), &job).await?;
        if (0..partitions).all(|p| stored.contains(&blobsnap::job::task_name(p))) {
            return Err(e);
        }
        let text = e.to_string();
        let text = text
            .strip_suffix(&format!(" [{}]", e.kind()))
            .unwrap_or(&text);
        return Err(Error::new(
            e.kind(),
            format!(
                "{text}. Give the demo the --dir, --partitions and --lines of the job's earlier runs (this run: {partitions} partitions x {lines} lines)"
            ),
        ));
    }
    let fresh = blobsnap::job::wordcount::input_params(&settings.input_dir).is_none();
    refuse_a_shorter_input(&settings, &blob_store, lines).await?;
    wordcount::generate_input(&settings.input_dir, partitions, lines, 42)?;
    if fresh {
        // A new host for a job with history (a failover): the input this run generated must
        // hold what the job committed, or the run would commit and then fail its check as if
        // the state were corrupt. Refused before anything runs; the input it wrote goes.
        if let Some(past) = offset_past(&settings, &blob_store, partitions, lines).await? {
            // What this run made, and nothing else: the input it generated (only when its
            // dir is this run's own), then the dirs it made, if they are empty.
            if made[0] {
                let _ = std::fs::remove_dir_all(&settings.input_dir);
            }
            drop(dir_lock);
            for (d, made) in [(&settings.state_dir, made[1]), (&dir, made[2])] {
                if made {
                    let _ = std::fs::remove_dir(d);
                }
            }
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "the demo's input would not hold what the job committed: task {:?} of job {}/{} committed offset {}, past the {lines} lines per partition this run generates ({} bytes); its check would fail as if the state were corrupt. Give the demo the --lines (and --partitions) of the job's earlier runs",
                    past.task, settings.job_name, settings.job_id, past.committed, past.within
                ),
            ));
        }
    }
    eprintln!(
        "demo: {partitions} partitions x {lines} lines in {}, blob store {blob_store}",
        settings.input_dir.display()
    );
    let on_commit: Arc<blobsnap::job::CommitObserver> = Arc::new(move |task, report, backup| {
        if json {
            return;
        }
        let s = backup
            .last_upload()
            .get("counts")
            .copied()
            .unwrap_or_default();
        // Every file of the snapshot is in one of the counts: sent, sent ahead (pre-upload),
        // already held, or small enough to travel inside the index.
        let inline = s
            .files
            .saturating_sub(s.files_uploaded + s.files_reused + s.files_pre_uploaded);
        let ahead = if s.files_pre_uploaded > 0 {
            format!(", pre-uploaded {}", s.files_pre_uploaded)
        } else {
            String::new()
        };
        println!(
                "{task:<12} checkpoint {} (#{}): {} files / {:.2} MiB: uploaded {} / {:.2} MiB{ahead}, reused {}, {inline} inline in the index; {} ms",
                report.checkpoint.id,
                report.seq,
                s.files,
                mib(s.bytes),
                s.files_uploaded,
                mib(s.bytes_uploaded),
                s.files_reused,
                report.sync_ms + report.upload_ms + report.write_ms + report.cleanup_ms
            );
    });
    let clock: Arc<dyn blobsnap::backend::Clock> = Arc::new(blobsnap::backend::SystemClock);
    let summaries = wordcount::run(&settings, blob_store, &admin, clock, on_commit).await?;
    let stored = wordcount::count_stores(&settings.state_dir, partitions)?;
    let expected = wordcount::count_input(&settings.input_dir, partitions)?;
    // With a `lengths` store, its counts too (each partition from where its store started).
    let lengths_ok = if settings.stores.iter().any(|s| s == "lengths") {
        let (stored, expected) =
            wordcount::check_lengths(&settings.state_dir, &settings.input_dir, partitions)?;
        Some(stored == expected)
    } else {
        None
    };
    let ok = stored == expected && lengths_ok != Some(false);
    report(json, &summaries, &stored, ok, lengths_ok);
    if !ok {
        return Err(Error::new(
                ErrorKind::Corrupt,
                "the stored counts differ from the input: state and offsets were not committed together",
            ));
    }
    Ok(())
}

/// The demo's input is generated: each partition's lines come from a seed of its own, so a
/// rerun with more lines (or partitions) extends the same input, and the committed offsets
/// and counts still describe its beginning. A rerun with fewer lines is fine while every
/// task's committed offset lies within them (the input is cut back to them: an earlier run
/// may have grown it without committing past it); an offset past them would end the check in
/// a mismatch that looks like corrupt state: refused (`InvalidInput`, before anything runs),
/// naming the task and its offset. With `start-from`, a task yet to start from the point is
/// checked at the point's offsets (where it will read on from).
async fn refuse_a_shorter_input(
    settings: &blobsnap::job::JobSettings,
    blob_store: &Arc<dyn blobsnap::blobstore::BlobStore>,
    lines: u64,
) -> blobsnap::Result<()> {
    let Some((old_partitions, old_lines, _)) =
        blobsnap::job::wordcount::input_params(&settings.input_dir)
    else {
        return Ok(());
    };
    if lines >= old_lines {
        return Ok(());
    }
    if let Some(past) = offset_past(settings, blob_store, old_partitions, lines).await? {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "the demo's input changed: this run asks for {lines} lines per partition, but task {:?} of job {}/{} committed offset {}, past the first {lines} lines of {} ({} bytes; it holds {old_lines}); its check would fail as if the state were corrupt. Run with --lines {old_lines}, or use a new --dir",
                past.task,
                settings.job_name,
                settings.job_id,
                past.committed,
                past.file.display(),
                past.within
            ),
        ));
    }
    Ok(())
}

/// A task whose committed offset lies past the first `lines` lines of its input file.
struct PastTheInput {
    task: String,
    committed: u64,
    within: u64,
    file: std::path::PathBuf,
}

/// The first task among the first `partitions` (and the run's) whose offset — where it will
/// read on from: its latest checkpoint, or the point of a start-from it has yet to apply —
/// lies past the first `lines` lines of its input file in `settings.input_dir`.
async fn offset_past(
    settings: &blobsnap::job::JobSettings,
    blob_store: &Arc<dyn blobsnap::blobstore::BlobStore>,
    partitions: u32,
    lines: u64,
) -> blobsnap::Result<Option<PastTheInput>> {
    use blobsnap::blob::history::CheckpointRef;
    use blobsnap::checkpoint::CheckpointStore as _;
    let job = blobsnap::layout::JobScope::new(&settings.job_name, &settings.job_id)?;
    let checkpoints =
        blobsnap::checkpoint::BlobCheckpointStore::new(Arc::clone(blob_store), job.clone());
    for p in 0..partitions.min(settings.partitions) {
        let task = blobsnap::job::task_name(p);
        // Where the task reads on from: the chosen point for a task that has yet to start
        // from it (a rollback or roll-forward: checked to exist before this), else its latest.
        let pending = match &settings.start_from {
            None => None,
            Some(point) => blobsnap::job::start_from_pending(blob_store.as_ref(), &task, settings)
                .await?
                .then_some(point),
        };
        let from = match pending {
            // A fork reads its source's offsets of the same input: not this job's history.
            Some(CheckpointRef::Fork(_)) => continue,
            Some(point) => Some(
                blobsnap::blob::history::resolve(blob_store, &job, &task, point)
                    .await?
                    .committed,
            ),
            None => checkpoints.latest(&task).await?,
        };
        let Some(latest) = from else {
            continue;
        };
        let committed = latest
            .checkpoint
            .offsets()
            .values()
            .filter_map(|o| o.parse::<u64>().ok())
            .max()
            .unwrap_or(0);
        let file = settings.input_dir.join(format!("{p}.txt"));
        let within = prefix_bytes(&file, lines)?;
        if committed > within {
            return Ok(Some(PastTheInput {
                task,
                committed,
                within,
                file,
            }));
        }
    }
    Ok(None)
}

/// The length in bytes of the first `lines` lines of `file`.
fn prefix_bytes(file: &std::path::Path, lines: u64) -> blobsnap::Result<u64> {
    use std::io::BufRead as _;
    let failed =
        |e: std::io::Error| Error::new(ErrorKind::Io, format!("read {}: {e}", file.display()));
    let f = std::fs::File::open(file).map_err(failed)?;
    let mut reader = std::io::BufReader::new(f);
    let (mut bytes, mut line) = (0u64, Vec::new());
    for _ in 0..lines {
        line.clear();
        let n = reader.read_until(b'\n', &mut line).map_err(failed)?;
        if n == 0 {
            break;
        }
        bytes += n as u64;
    }
    Ok(bytes)
}

/// What a store's restore did, in words: downloaded, reused (from a warm standby among
/// them), and what a lazy restore left to fetch after the store opened.
fn restore_line(store: &str, r: &blobsnap::backend::RestoreSummary) -> String {
    let mut line = format!(
        "store {store} restored: downloaded {} files / {:.2} MiB, reused {} files / {:.2} MiB",
        r.files_downloaded,
        mib(r.bytes_downloaded),
        r.files_reused,
        mib(r.bytes_reused)
    );
    if r.files_from_standby > 0 {
        line.push_str(&format!(
            " ({} files / {:.2} MiB from the warm standby)",
            r.files_from_standby,
            mib(r.bytes_from_standby)
        ));
    }
    if r.files_left_remote > 0 {
        line.push_str(&format!(
            "; lazily: {} files / {:.2} MiB of the download came after the store opened (on demand or in the background)",
            r.files_left_remote,
            mib(r.bytes_left_remote)
        ));
    }
    line
}

/// Print what the demo's tasks did and the check of their counts.
fn report(
    json: bool,
    summaries: &[blobsnap::job::TaskSummary],
    stored: &std::collections::BTreeMap<String, u64>,
    ok: bool,
    lengths_ok: Option<bool>,
) {
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
                    "processed": s.processed, "commits": s.commits,
                    "commits-skipped": s.commits_skipped, "commits-failed": s.commits_failed,
                    "sweeps": s.sweeps, "swept": s.swept,
                    "fell-back-to": s.fell_back_to,
                    "started-from": s.started_from,
                    "restored": s.restored.iter().map(|(store, r)| (store.clone(), serde_json::json!({
                        "files": r.files, "bytes": r.bytes,
                        "files-downloaded": r.files_downloaded, "bytes-downloaded": r.bytes_downloaded,
                        "files-reused": r.files_reused, "bytes-reused": r.bytes_reused,
                        "files-from-standby": r.files_from_standby, "bytes-from-standby": r.bytes_from_standby,
                        "files-left-remote": r.files_left_remote, "bytes-left-remote": r.bytes_left_remote,
                    }))).collect::<serde_json::Map<_, _>>(),
                })).collect::<Vec<_>>(),
                "words": stored.len(),
                "total": total,
                "check": if ok { "ok" } else { "mismatch" },
                "lengths-check": lengths_ok.map(|ok| if ok { "ok" } else { "mismatch" }),
            })
        );
    } else {
        for s in summaries {
            println!(
                    "{}: resumed from offset {}, processed {} messages, {} commits ({} skipped while one was in flight, {} failed and retried), {} sweeps",
                    s.task,
                    s.resumed_from,
                    s.processed,
                    s.commits,
                    s.commits_skipped,
                    s.commits_failed,
                    s.sweeps
                );
            for (store, r) in s.restored.iter().filter(|(_, r)| r.files > 0) {
                println!("{}: {}", s.task, restore_line(store, r));
            }
            if let Some(note) = &s.started_from {
                println!("{}: {note}", s.task);
            }
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
        if let Some(l) = lengths_ok {
            println!(
                "check: the word lengths in the lengths stores {} an independent count of the input from where each store started",
                if l { "equal" } else { "DIFFER FROM" }
            );
        }
    }
}

/// Serve the metrics in Prometheus' text format at `http://<addr>/metrics` (port 0: any free
/// port) for as long as the process runs; returns the address bound, which the demo prints.
pub(crate) async fn serve_metrics(
    addr: std::net::SocketAddr,
) -> blobsnap::Result<std::net::SocketAddr> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| Error::new(ErrorKind::InvalidInput, format!("metrics recorder: {e}")))?;
    // Every metric's `# HELP` / `# TYPE`, and the unlabelled counters at 0.
    blobsnap::telemetry::describe();
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
