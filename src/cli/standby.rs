//! `blobsnap standby`: a warm standby of one task of the demo job.

use std::path::PathBuf;
use std::sync::Arc;

use super::args::{open_demo_store, StoreArgs};
use super::progress::mib;
use blobsnap::config::Settings;
use blobsnap::job::standby::{follow, StandbySettings, StandbyUpdate};
use blobsnap::{Error, ErrorKind};
use clap::Args;

#[derive(Args)]
pub(crate) struct StandbyArgs {
    /// The demo's dir on this host (its state dir is DIR/state; without store flags the blob
    /// store is DIR/store, as for `blobsnap demo`).
    #[arg(long, default_value = "blobsnap-demo")]
    pub(crate) dir: PathBuf,
    /// The task to follow.
    #[arg(long, default_value = "Partition 0")]
    pub(crate) task: String,
    /// The task's stores, comma-separated.
    #[arg(long, default_value = "counts", value_delimiter = ',')]
    pub(crate) stores: Vec<String>,
    /// How often to look for a new checkpoint, in milliseconds (one LIST request each).
    #[arg(long, default_value_t = 1000)]
    pub(crate) poll_ms: u64,
    /// Stop after this checkpoint number is applied (default: follow until interrupted).
    #[arg(long)]
    pub(crate) until_seq: Option<u64>,
}

pub(crate) async fn run(
    store_args: &StoreArgs,
    json: bool,
    args: StandbyArgs,
) -> blobsnap::Result<()> {
    let settings = Settings::load(store_args.config.as_deref())?;
    let job = &settings.job;
    // The tasks replace their store dirs under DIR/state by restores: never the blob store
    // in use, the home, the current dir or a dir holding one of them.
    blobsnap::local::guard::refuse_special(
        "--dir's state dir",
        &args.dir.join("state"),
        &super::args::protected_store(store_args, Some(&args.dir)),
    )?;
    // Without store flags the store is the demo's, DIR/store: a DIR without one is a wrong
    // --dir (a standby there would wait forever for a job that is not in it), or a job whose
    // store is elsewhere (its flags were left out).
    if !store_args.names_a_store() && !args.dir.join("store").is_dir() {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!(
                "no blob store to stand by for: {} does not exist (without store flags a standby follows the demo's store under --dir); give the job's --dir, or the job's store flags (--local DIR, --bucket B …)",
                args.dir.join("store").display()
            ),
        ));
    }
    let blob_store = open_demo_store(store_args, &args.dir).await?;
    let job_settings = blobsnap::job::JobSettings {
        job_name: job.name.clone(),
        job_id: job.id.clone(),
        state_dir: args.dir.join("state"),
        input_dir: args.dir.join("input"),
        stream: "lines".into(),
        stores: args.stores,
        partitions: 1,
        commit_every: 1,
        commit_interval: Default::default(),
        retention: job.retention.last,
        unsafe_no_fencing: true,
        commit_max_delay: Default::default(),
        sweep_every_commits: 0,
        gc_grace: std::time::Duration::from_secs(job.gc_grace_secs),
        restore_fallback: false,
        deployment_id: job.deployment_id.clone(),
        create_resources: false,
        index_inline_below: blobsnap::blob::backup::INLINE_BELOW,
        restore_mode: blobsnap::job::RestoreMode::Full,
        lazy_download_rate: blobsnap::local::lazy::DEFAULT_RATE,
        pre_upload: false,
        start_from: None,
        start_from_id: None,
        retention_tiers: Vec::new(),
        stop: Default::default(),
    };
    let backend: Arc<dyn blobsnap::backend::StateBackendFactory> =
        Arc::new(blobsnap::blob::factory::BlobStateBackendFactory::new(
            Arc::clone(&blob_store),
            None,
            Default::default(),
            blobsnap::blob::restore::RestoreSettings::default(),
            job.deployment_id.clone(),
        ));
    // A task that has not committed (or a typo): say so now, with the tasks that have, and
    // again every minute while it stays so.
    let scope = blobsnap::layout::JobScope::new(&job.name, &job.id)?;
    // Only for the message: a store that does not answer now is the polling's to wait out.
    let others = blobsnap::blob::history::task_names(blob_store.as_ref(), &scope).await;
    let waiting = {
        let known = match others {
            Ok(o) if o.is_empty() => "no task of the job has committed yet".to_string(),
            Ok(o) => format!(
                "tasks with checkpoints: {}",
                o.iter().cloned().collect::<Vec<_>>().join(", ")
            ),
            Err(e) => format!("the job's tasks could not be listed: {e}"),
        };
        format!(
            "standby {}: the task has no checkpoint yet in job {}/{} ({known}); waiting for its first commit, polling every {} ms",
            args.task, job.name, job.id, args.poll_ms.max(10)
        )
    };
    let last_said = std::sync::Mutex::new(None::<std::time::Instant>);
    let stop =
        super::signal::stop_on_signal("the standby stops between polls; its copy stays consistent");
    let until = args.until_seq;
    let task = args.task.clone();
    let stop_at = stop.clone();
    // Stopped at `--until-seq` (exit 0) rather than by a signal (exit 10, as every command).
    let reached = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reached_at = Arc::clone(&reached);
    let on_update = move |u: &StandbyUpdate| match u {
        StandbyUpdate::Applied {
            seq,
            checkpoint_id,
            bytes_downloaded,
            bytes_reused,
        } => {
            let id = checkpoint_id.map(|c| c.to_string()).unwrap_or_default();
            if json {
                println!(
                    "{}",
                    serde_json::json!({"schema": 1, "task": task, "applied": seq, "checkpoint-id": id,
                        "bytes-downloaded": bytes_downloaded, "bytes-reused": bytes_reused})
                );
            } else {
                println!(
                    "standby {task}: checkpoint #{seq} ({id}) applied: downloaded {:.2} MiB, reused {:.2} MiB",
                    mib(*bytes_downloaded),
                    mib(*bytes_reused)
                );
            }
            if until.is_some_and(|u| *seq >= u) {
                reached_at.store(true, std::sync::atomic::Ordering::Release);
                stop_at.cancel();
            }
        }
        StandbyUpdate::Skipped { seq, message, .. } => {
            eprintln!("standby {task}: checkpoint #{seq} not applied: {message}");
        }
        StandbyUpdate::Unchanged {
            latest: Some(_), ..
        } => {}
        StandbyUpdate::Unchanged { latest: None, .. } => {
            let mut last = last_said
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if last.is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(60)) {
                eprintln!("{waiting}");
                *last = Some(std::time::Instant::now());
            }
        }
    };
    let clock: Arc<dyn blobsnap::backend::Clock> = Arc::new(blobsnap::backend::SystemClock);
    follow(
        &job_settings,
        &args.task,
        blob_store,
        &backend,
        clock,
        &StandbySettings {
            poll: std::time::Duration::from_millis(args.poll_ms.max(10)),
        },
        stop.clone(),
        &on_update,
    )
    .await?;
    if stop.is_cancelled() && !reached.load(std::sync::atomic::Ordering::Acquire) {
        return Err(blobsnap::Error::new(
            blobsnap::ErrorKind::Cancelled,
            format!(
                "standby of {:?} stopped by a signal; its standby dirs hold the last checkpoint it applied",
                args.task
            ),
        ));
    }
    Ok(())
}
