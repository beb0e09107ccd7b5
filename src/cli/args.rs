//! The command line: its argument types and the store it names.

use std::io::Read as _;
use std::path::PathBuf;
use std::sync::Arc;

use blobsnap::blob::FACTORY_NAME;
use blobsnap::blobstore::BlobStore;
use blobsnap::config::{Settings, StoreKind};
use blobsnap::{Error, ErrorKind};
use clap::{Args, Subcommand};

/// Where the blob store is: a settings file, `BLOBSNAP_*`/`AWS_*` environment, or these flags
/// (flags win).
#[derive(Args)]
pub(crate) struct StoreArgs {
    /// A TOML settings file (docs/configuration.md).
    #[arg(
        long,
        global = true,
        help_heading = "Blob store (every command)",
        env = "BLOBSNAP_CONFIG"
    )]
    pub(crate) config: Option<PathBuf>,
    /// Use the local directory store at DIR.
    #[arg(
        long,
        global = true,
        help_heading = "Blob store (every command)",
        value_name = "DIR"
    )]
    pub(crate) local: Option<PathBuf>,
    /// Use S3 (or an S3-compatible server) with this bucket.
    #[arg(long, global = true, help_heading = "Blob store (every command)")]
    pub(crate) bucket: Option<String>,
    /// S3 endpoint URL (MinIO, LocalStack, Garage: http://127.0.0.1:PORT).
    #[arg(long, global = true, help_heading = "Blob store (every command)")]
    pub(crate) s3_endpoint: Option<String>,
    /// S3 region.
    #[arg(long, global = true, help_heading = "Blob store (every command)")]
    pub(crate) s3_region: Option<String>,
    /// Key prefix inside the bucket ("" or ending in "/").
    #[arg(long, global = true, help_heading = "Blob store (every command)")]
    pub(crate) s3_prefix: Option<String>,
    /// Path-style addressing (most S3-compatible servers need it).
    #[arg(long, global = true, help_heading = "Blob store (every command)")]
    pub(crate) s3_path_style: bool,
    /// Transfers in flight at once, for the whole process [store.max-transfers, 16].
    #[arg(
        long,
        global = true,
        help_heading = "Limits of the whole process (every command)",
        value_name = "N"
    )]
    pub(crate) max_transfers: Option<usize>,
    /// Upload bandwidth, bytes/s: "50MiB/s" [store.max-upload-rate; 0: none].
    #[arg(long, global = true, help_heading = "Limits of the whole process (every command)", value_name = "RATE", value_parser = parse_rate)]
    pub(crate) max_upload_rate: Option<u64>,
    /// Download bandwidth, bytes/s: "200MiB/s" [store.max-download-rate; 0: none].
    #[arg(long, global = true, help_heading = "Limits of the whole process (every command)", value_name = "RATE", value_parser = parse_rate)]
    pub(crate) max_download_rate: Option<u64>,
    /// Requests per second [store.max-request-rate; 0: none].
    #[arg(
        long,
        global = true,
        help_heading = "Limits of the whole process (every command)",
        value_name = "N"
    )]
    pub(crate) max_request_rate: Option<u64>,
}

fn parse_rate(v: &str) -> Result<u64, String> {
    blobsnap::units::parse_rate(v)
}

impl StoreArgs {
    /// The limit flags on top of `settings`.
    pub(crate) fn apply_limits(&self, settings: &mut Settings) -> blobsnap::Result<()> {
        if let Some(n) = self.max_transfers {
            if n == 0 {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    "--max-transfers 0: at least one transfer must be allowed",
                ));
            }
            settings.store.max_transfers = n;
        }
        if let Some(v) = self.max_upload_rate {
            settings.store.max_upload_rate = v;
        }
        if let Some(v) = self.max_download_rate {
            settings.store.max_download_rate = v;
        }
        if let Some(v) = self.max_request_rate {
            settings.store.max_request_rate = v;
        }
        Ok(())
    }
}

/// Which store's snapshots, as given on the command line: a manual backup's name, or job,
/// job id, task and store.
#[derive(Args)]
pub(crate) struct SnapshotFlags {
    /// A manual backup (`blobsnap backup --db D --name NAME`): the same as `--job manual
    /// --job-id NAME --task backup --store db`.
    #[arg(long, conflicts_with_all = ["job", "task", "store"])]
    name: Option<String>,
    /// The job's name.
    #[arg(long, required_unless_present = "name")]
    job: Option<String>,
    /// The job's id.
    #[arg(long, default_value = "1")]
    job_id: String,
    /// The task's name.
    #[arg(long, required_unless_present = "name")]
    task: Option<String>,
    /// The store's name.
    #[arg(long, required_unless_present = "name")]
    store: Option<String>,
}

impl SnapshotFlags {
    /// The store these flags name.
    pub(crate) fn resolve(self) -> blobsnap::Result<SnapshotArgs> {
        match (self.name, self.job, self.task, self.store) {
            (Some(name), None, None, None) => Ok(SnapshotArgs::manual(&name)),
            (None, Some(job), Some(task), Some(store)) => Ok(SnapshotArgs {
                job,
                job_id: self.job_id,
                task,
                store,
            }),
            _ => Err(Error::new(
                ErrorKind::InvalidInput,
                "name a store: --name NAME (a manual backup), or --job, --task and --store",
            )),
        }
    }
}

/// A job deployment, as given on the command line: `--job J [--job-id I]`, or a manual
/// backup's `--name N` (the same as `--job manual --job-id N`).
#[derive(Args)]
pub(crate) struct JobFlags {
    /// The job's name.
    #[arg(long, required_unless_present = "name")]
    job: Option<String>,
    /// The job's id.
    #[arg(long, default_value = "1")]
    job_id: String,
    /// A manual backup (`blobsnap backup --name NAME`).
    #[arg(long, conflicts_with = "job")]
    name: Option<String>,
}

impl JobFlags {
    /// (job name, job id).
    pub(crate) fn names(&self) -> blobsnap::Result<(String, String)> {
        match (&self.job, &self.name) {
            (Some(j), None) => Ok((j.clone(), self.job_id.clone())),
            (None, Some(n)) => Ok((blobsnap::blob::manual::JOB.to_string(), n.clone())),
            _ => Err(Error::new(
                ErrorKind::InvalidInput,
                "name a job: --job J [--job-id I], or a manual backup: --name N",
            )),
        }
    }
}

/// A job deployment: `--job J [--job-id I]` (a manual backup: `--job manual --job-id NAME`).
#[derive(Args)]
pub(crate) struct JobIdFlags {
    /// The job's name.
    #[arg(long)]
    pub(crate) job: String,
    /// The job's id.
    #[arg(long, default_value = "1")]
    pub(crate) job_id: String,
}

/// Which store's snapshots: job, job id, task, store.
pub(crate) struct SnapshotArgs {
    pub(crate) job: String,
    pub(crate) job_id: String,
    pub(crate) task: String,
    pub(crate) store: String,
}

impl SnapshotArgs {
    /// The store of the manual backup `name` ([`blobsnap::blob::manual`]).
    pub(crate) fn manual(name: &str) -> Self {
        use blobsnap::blob::manual::{JOB, STORE, TASK};
        SnapshotArgs {
            job: JOB.into(),
            job_id: name.into(),
            task: TASK.into(),
            store: STORE.into(),
        }
    }
}

impl SnapshotArgs {
    /// Whose snapshots these are.
    pub(crate) fn who(&self) -> blobsnap::blob::Expected<'_> {
        blobsnap::blob::Expected {
            job_name: &self.job,
            job_id: &self.job_id,
            task_name: &self.task,
            store_name: &self.store,
        }
    }

    /// Load and check the snapshot `marker` names ([`blobsnap::blob::load_snapshot`]).
    pub(crate) async fn load(
        &self,
        blob_store: &dyn BlobStore,
        marker: &str,
    ) -> blobsnap::Result<blobsnap::blob::LoadedSnapshot> {
        blobsnap::blob::load_snapshot(blob_store, &self.who(), marker).await
    }
}

impl SnapshotArgs {
    /// The marker to use: the one given, or the store's marker in the task's latest checkpoint.
    pub(crate) async fn resolve_marker(
        &self,
        blob_store: &Arc<dyn BlobStore>,
        marker: Option<String>,
    ) -> blobsnap::Result<(String, Option<blobsnap::checkpoint::CommittedCheckpoint>)> {
        use blobsnap::checkpoint::CheckpointStore as _;
        let (job, job_id, task, store) = (&self.job, &self.job_id, &self.task, &self.store);
        let r = match marker {
            // A marker as it is (its checks come when it is loaded).
            Some(m) if m.starts_with("index/") => return Ok((m, None)),
            Some(m) => m.parse::<blobsnap::blob::history::CheckpointRef>()?,
            None => blobsnap::blob::history::CheckpointRef::Latest,
        };
        let scope = blobsnap::layout::JobScope::new(job, job_id)?;
        if r != blobsnap::blob::history::CheckpointRef::Latest {
            let resolved =
                match blobsnap::blob::history::resolve(blob_store, &scope, task, &r).await {
                    Ok(r) => r,
                    // A task that has no history is named as such (a typo, an unquoted name), not
                    // as a reference that matched nothing in it.
                    Err(e) => return Err(self.unknown_task(blob_store, &scope).await.unwrap_or(e)),
                };
            let m = resolved.marker(store).map(str::to_string).ok_or_else(|| {
                Error::new(
                    ErrorKind::NotFound,
                    format!(
                        "checkpoint #{} of task {task:?} ({r}) has no snapshot of store {store:?}{}",
                        resolved.committed.seq,
                        stores_in(&resolved.committed.checkpoint)
                    ),
                )
            })?;
            eprintln!(
                "{r} of task {task:?} is checkpoint #{}{}: {m}",
                resolved.committed.seq,
                resolved
                    .savepoint
                    .as_deref()
                    .map(|n| format!(" (savepoint {n})"))
                    .unwrap_or_default()
            );
            return Ok((m, Some(resolved.committed)));
        }
        let cps =
            blobsnap::checkpoint::BlobCheckpointStore::new(Arc::clone(blob_store), scope.clone());
        let Some(latest) = cps.latest(task).await? else {
            return Err(self
                .unknown_task(blob_store, &scope)
                .await
                .unwrap_or_else(|| {
                    Error::new(
                        ErrorKind::NotFound,
                        format!("task {task:?} of {job}/{job_id} has no checkpoint"),
                    )
                }));
        };
        let m = latest
            .checkpoint
            .as_v2()
            .and_then(|c| c.marker(FACTORY_NAME, store))
            .map(str::to_string)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::NotFound,
                    format!(
                        "the latest checkpoint of task {task:?} has no snapshot of store {store:?}{}",
                        stores_in(&latest.checkpoint)
                    ),
                )
            })?;
        Ok((m, Some(latest)))
    }

    /// Why the task has nothing to resolve against, if it is the job or the task that is
    /// unknown: `NotFound` naming the job (nothing stored under it) or listing the job's tasks
    /// that have a checkpoint. `None` when the task has a history (the caller's error stands).
    async fn unknown_task(
        &self,
        blob_store: &Arc<dyn BlobStore>,
        scope: &blobsnap::layout::JobScope,
    ) -> Option<Error> {
        if let Err(e) = blobsnap::blob::history::require_job(blob_store.as_ref(), scope).await {
            return Some(e);
        }
        let tasks = blobsnap::blob::history::task_names(blob_store.as_ref(), scope)
            .await
            .ok()?;
        if tasks.contains(&self.task) {
            return None;
        }
        let listed: Vec<String> = tasks.iter().map(|t| format!("{t:?}")).collect();
        let quote = if tasks.iter().any(|t| t.contains(' ')) {
            " (a name with a space is quoted: --task 'Partition 0')"
        } else {
            ""
        };
        Some(Error::new(
            ErrorKind::NotFound,
            format!(
                "job {}/{} has no task {:?} with a checkpoint; its tasks: {}{quote}",
                self.job,
                self.job_id,
                self.task,
                if listed.is_empty() {
                    "none yet".to_string()
                } else {
                    listed.join(", ")
                }
            ),
        ))
    }
}

/// `; its stores: "a", "b"` — the stores a checkpoint has a blob snapshot of, for a message
/// about a store it lacks.
fn stores_in(c: &blobsnap::checkpoint::Checkpoint) -> String {
    let stores: Vec<String> = c
        .as_v2()
        .and_then(|c| c.state_checkpoint_markers.get(FACTORY_NAME))
        .map(|m| m.keys().map(|s| format!("{s:?}")).collect())
        .unwrap_or_default();
    if stores.is_empty() {
        "; it has none".to_string()
    } else {
        format!("; its stores: {}", stores.join(", "))
    }
}

/// The job deployment an admin command is about.
#[derive(Args)]
pub(crate) struct DeploymentArgs {
    /// The job's name.
    #[arg(long)]
    pub(crate) job: String,
    /// The job's id.
    #[arg(long, default_value = "1")]
    pub(crate) job_id: String,
    /// The deployment's id [job.deployment-id, default "default"].
    #[arg(long)]
    pub(crate) deployment: Option<String>,
}

#[derive(Subcommand)]
pub(crate) enum AdminAction {
    /// Create what the deployment needs: on S3 the bucket (if missing and allowed) and a
    /// lifecycle rule that aborts incomplete multipart uploads under the job's prefix (merged
    /// into the bucket's rules, never replacing them); then the owner record scope.json.
    Create {
        #[command(flatten)]
        d: DeploymentArgs,
        /// Record this as the job's sweep grace (`gc` refuses a shorter one unless forced)
        /// [job.gc-grace-secs].
        #[arg(long, value_parser = blobsnap::units::parse_secs)]
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
pub(crate) enum ShowAction {
    /// Read FILE (or `-` for stdin), validate, print normalized JSON on stdout.
    Show {
        /// The document, or `-` for standard input.
        file: String,
    },
}

pub(crate) fn read_input(file: &str) -> blobsnap::Result<Vec<u8>> {
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

pub(crate) async fn open_store(args: &StoreArgs) -> blobsnap::Result<Arc<dyn BlobStore>> {
    store_settings(args)?.open_store().await
}

/// The admin of a job deployment on `store` (opened from `args`; `None`: the demo's default
/// local store): on S3 it also gets the raw client for the bucket and lifecycle calls.
pub(crate) async fn open_admin(
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
impl StoreArgs {
    /// The store flags this command was given, shell-quoted, for a command line the user can
    /// paste (the environment and the settings file it names stay as they are).
    pub(crate) fn as_flags(&self) -> String {
        let mut out: Vec<String> = Vec::new();
        let mut flag = |name: &str, value: Option<String>| {
            if let Some(v) = value {
                out.push(format!("--{name} {}", shell_quote(&v)));
            }
        };
        flag(
            "config",
            self.config.as_ref().map(|p| p.display().to_string()),
        );
        flag(
            "local",
            self.local.as_ref().map(|p| p.display().to_string()),
        );
        flag("bucket", self.bucket.clone());
        flag("s3-endpoint", self.s3_endpoint.clone());
        flag("s3-region", self.s3_region.clone());
        flag("s3-prefix", self.s3_prefix.clone());
        if self.s3_path_style {
            out.push("--s3-path-style".into());
        }
        out.join(" ")
    }

    /// Whether the flags, the settings file or the environment name a blob store. A settings
    /// file names one only with a `[store]` table: a file of `[job]` settings alone leaves
    /// `demo` and `standby` on their `--dir/store` (issue 51, item 8: it moved the demo to the
    /// settings' default `./blobsnap-store`, a new empty store). A file that cannot be read
    /// counts as naming one: loading it then says what is wrong.
    pub(crate) fn names_a_store(&self) -> bool {
        self.local.is_some()
            || self.bucket.is_some()
            || self.config.as_deref().is_some_and(config_names_a_store)
            || std::env::var_os("BLOBSNAP_STORE").is_some()
            || std::env::var_os("BLOBSNAP_LOCAL_DIR").is_some()
    }
}

/// Whether the settings file at `path` sets `[store] key` (unreadable or unparsable: true, so
/// that loading it says what is wrong).
fn config_store_has(path: &std::path::Path, key: &str) -> bool {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|text| text.parse::<toml::Table>().ok())
        .is_none_or(|t| {
            t.get("store")
                .and_then(|s| s.as_table())
                .is_some_and(|s| s.contains_key(key))
        })
}

/// Whether the settings file at `path` has a `[store]` table (unreadable or unparsable: true).
fn config_names_a_store(path: &std::path::Path) -> bool {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|text| text.parse::<toml::Table>().ok())
        .is_none_or(|t| t.contains_key("store"))
}

/// The store a command works on that reads or changes what exists (everything but `demo`,
/// `standby`, `backup` and `admin create`): a local store whose directory does not exist is
/// `NotFound` naming it — never created by a typo in `--local`.
pub(crate) async fn open_existing_store(
    args: &StoreArgs,
) -> blobsnap::Result<std::sync::Arc<dyn blobsnap::blobstore::BlobStore>> {
    let settings = store_settings(args)?;
    if settings.store.kind == StoreKind::Local && !settings.store.local_dir.is_dir() {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!(
                "the local store {} does not exist (a typo in --local? this command never creates a store; `demo`, `backup` and `admin create` do)",
                settings.store.local_dir.display()
            ),
        ));
    }
    settings.open_store().await
}

/// The demo's blob store (and its standby's): the one the flags name, else the embedded
/// default, a local store under `dir/store`, with the layers of any other.
pub(crate) async fn open_demo_store(
    args: &StoreArgs,
    dir: &std::path::Path,
) -> blobsnap::Result<std::sync::Arc<dyn blobsnap::blobstore::BlobStore>> {
    if args.names_a_store() {
        return open_store(args).await;
    }
    let mut settings = blobsnap::config::Settings::load(None)?;
    args.apply_limits(&mut settings)?;
    settings.store.kind = blobsnap::config::StoreKind::Local;
    settings.store.local_dir = dir.join("store");
    settings.open_store().await
}

/// The local blob store a command uses, as a dir no command may replace or write into
/// (`blobsnap::local::guard`): the flags' or settings' local store, or for `demo` and
/// `standby` without store flags, `demo_dir/store`. Empty for S3.
pub(crate) fn protected_store(
    args: &StoreArgs,
    demo_dir: Option<&std::path::Path>,
) -> Vec<blobsnap::local::guard::Protected> {
    let dir = match demo_dir {
        Some(d) if !args.names_a_store() => Some(d.join("store")),
        _ => store_settings(args)
            .ok()
            .filter(|s| s.store.kind == StoreKind::Local)
            .map(|s| s.store.local_dir),
    };
    dir.map(|d| blobsnap::local::guard::Protected::new("the local blob store in use", d))
        .into_iter()
        .collect()
}

/// The user's cache dir for blobsnap (`$XDG_CACHE_HOME/blobsnap`, else
/// `$HOME/.cache/blobsnap`); `None` when neither is set — never a shared temp dir, where
/// another user could plant a cache or a symlink (the commands then hash instead of caching).
pub(crate) fn user_cache_dir() -> Option<std::path::PathBuf> {
    let dir = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| std::path::PathBuf::from(h).join(".cache"))
        })?
        .join("blobsnap");
    Some(dir)
}

/// The hash cache dir of `backup` and `restore`: `<user cache dir>/hashcache`, or `None`
/// (no cache: every reused file is read) with a warning when there is no user cache dir.
pub(crate) fn hash_cache_dir() -> Option<std::path::PathBuf> {
    let dir = user_cache_dir().map(|d| d.join("hashcache"));
    if dir.is_none() {
        tracing::warn!("neither XDG_CACHE_HOME nor HOME is set: no hash cache (files are hashed instead of proved from a cache)");
    }
    dir
}

/// The settings file and environment, with the store flags on top.
pub(crate) fn store_settings(args: &StoreArgs) -> blobsnap::Result<Settings> {
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
    args.apply_limits(&mut settings)?;
    // A local store needs its dir named (a flag, the settings file, or BLOBSNAP_LOCAL_DIR),
    // never the relative default: a typo'd environment would otherwise write to ./blobsnap-store.
    // A settings file names it only with `[store] local-dir`.
    if settings.store.kind == StoreKind::Local
        && args.local.is_none()
        && !args
            .config
            .as_deref()
            .is_some_and(|p| config_store_has(p, "local-dir"))
        && std::env::var_os("BLOBSNAP_LOCAL_DIR").is_none()
    {
        let file = match &args.config {
            Some(p) => format!(
                "the settings file {} names no store (no [store] local-dir, and no kind = \"s3\"); ",
                p.display()
            ),
            None => String::new(),
        };
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("no blob store given: {file}use --local DIR, --bucket B (S3) or --config FILE, or in the environment BLOBSNAP_LOCAL_DIR=DIR (with BLOBSNAP_STORE=local, the default) or BLOBSNAP_STORE=s3 with BLOBSNAP_S3_BUCKET=B"),
        ));
    }
    Ok(settings)
}

/// `s` as one shell word: as it is when it is made of safe characters, else single-quoted.
pub(crate) fn shell_quote(s: &str) -> String {
    let safe = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@,+%".contains(c));
    if safe {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}
