//! Settings as plain serde data: a TOML file, then `BLOBSNAP_*` environment variables on top.
//! Sizes and durations take the integers of the field's unit or strings such as `"16MiB"` and
//! `"30s"` ([`crate::units`]).
//! Credentials are not settings: the S3 store takes them from the AWS default chain.
//!
//! ```toml
//! [store]
//! kind = "s3"              # or "local" (the default)
//! local-dir = "/var/lib/blobsnap/store"
//! max-transfers = 16       # in flight at once, for the whole process
//! max-upload-rate = "100MiB/s"   # bandwidth and request-rate limits of the whole process
//! max-download-rate = "200MiB/s" #   (0 or absent: none)
//! max-request-rate = 500
//! pre-upload = true        # a job uploads table/blob files as RocksDB finishes them
//!
//! [s3]
//! bucket = "state-backups"
//! prefix = "prod/"
//! endpoint = "http://127.0.0.1:9000"
//! path-style = true
//!
//! [retry]
//! budget-ms = 120000
//!
//! [job]                    # the runtime / demo
//! partitions = 4
//! commit-every = 2500      # messages
//! commit-ms = 60000        # and/or time
//! retention = 2          # or "last 3, every 5m for 1d, every 1h for 7d"
//! gc-grace-secs = 86400    # recorded in scope.json: `blobsnap gc` refuses a shorter one
//! deployment-id = "prod-eu"  # recorded in scope.json: another deployment is refused
//! create-resources = true  # bucket, abort-multipart rule, owner record; validated always
//! index-inline-below = "64KiB"  # smaller files travel inline in the index; 0: Samza's v1 shape
//! # start-from = "savepoint:before-upgrade"  # rollback / roll-forward, applied once per value
//! # start-from-id = "2026-12-05"              # and per id: a new id applies it again
//! #                                           # ("savepoint:JOB/JOB-ID/NAME": fork another job)
//!
//! [cost]                   # prices for `blobsnap cost`, dollars (S3 Standard's list prices)
//! put-per-1000 = 0.005     # PUT, POST, LIST
//! get-per-1000 = 0.0004    # GET, HEAD
//! delete-per-1000 = 0.0
//! storage-per-gb-month = 0.023
//! ```
//!
//! | variable | setting |
//! |---|---|
//! | `BLOBSNAP_STORE` | `store.kind` (`local` or `s3`) |
//! | `BLOBSNAP_LOCAL_DIR` | `store.local-dir` |
//! | `BLOBSNAP_MAX_TRANSFERS` | `store.max-transfers` (default 16, for the whole process) |
//! | `BLOBSNAP_MAX_UPLOAD_RATE`, `BLOBSNAP_MAX_DOWNLOAD_RATE` | `store.max-upload-rate`, `store.max-download-rate` (bytes/s, `"50MiB/s"`; default 0, no limit) |
//! | `BLOBSNAP_MAX_REQUEST_RATE` | `store.max-request-rate` (requests/s; default 0, no limit) |
//! | `BLOBSNAP_PRE_UPLOAD` | `store.pre-upload` (`true`/`false`; default true) |
//! | `BLOBSNAP_S3_BUCKET`, `BLOBSNAP_S3_PREFIX`, `BLOBSNAP_S3_ENDPOINT`, `BLOBSNAP_S3_REGION` | `s3.bucket`, `s3.prefix`, `s3.endpoint`, `s3.region` |
//! | `BLOBSNAP_S3_PATH_STYLE` | `s3.path-style` (`true`/`false`) |
//! | `BLOBSNAP_S3_CA_BUNDLE` | `s3.ca-bundle` |
//! | `BLOBSNAP_S3_RESOLVE` | `s3.resolve`, as `name=ip,*.name=ip` (replaces the file's table) |
//! | `BLOBSNAP_S3_CREATE_ONLY` | `s3.create-only` (`auto` = probe, the default; `atomic`, `racy`, `ignored`) |
//! | `BLOBSNAP_S3_MULTIPART_LISTING` | `s3.multipart-listing` (`false` where ListMultipartUploads is missing) |
//! | `BLOBSNAP_JOB_PARTITIONS`, `BLOBSNAP_JOB_COMMIT_EVERY` | `job.partitions`, `job.commit-every` |

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::blobstore::limit::{Budget, LimitStore, Limits};
use crate::blobstore::local::LocalStore;
use crate::blobstore::retry::{RetryPolicy, RetryStore};
use crate::blobstore::s3::{CreateOnlySetting, S3Config, S3Store};
use crate::blobstore::BlobStore;
use crate::error::{Error, Result};

/// Which blob store to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StoreKind {
    /// A local directory (the embedded default).
    #[default]
    Local,
    /// S3 or an S3-compatible server.
    S3,
}

/// `[store]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct StoreSettings {
    /// Local or S3.
    pub kind: StoreKind,
    /// Root of the local store.
    pub local_dir: PathBuf,
    /// Transfers (PUT, GET with its body, HEAD, batch delete) in flight at once through the
    /// opened store, across every task and store of the process ([`LimitStore`]); the most
    /// the window opens to when a throttling store has narrowed it.
    pub max_transfers: usize,
    /// Upload bandwidth of the whole process, bytes/s (`"50MiB/s"`); 0: no limit.
    #[serde(deserialize_with = "crate::units::rate")]
    pub max_upload_rate: u64,
    /// Download bandwidth of the whole process, bytes/s; 0: no limit.
    #[serde(deserialize_with = "crate::units::rate")]
    pub max_download_rate: u64,
    /// Requests per second of the whole process; 0: no limit.
    pub max_request_rate: u64,
    /// A running job uploads each table or blob file as soon as RocksDB has finished writing
    /// it, in the background and below the commits' priority, so that a commit after a
    /// compaction burst uploads only what is not up yet ([`crate::blob::commit::preupload`]). Off by
    /// default: it has not met its latency targets everywhere (RESULTS.md §7).
    pub pre_upload: bool,
}

impl StoreSettings {
    /// The limits of the process's one budget.
    pub fn limits(&self) -> Limits {
        Limits {
            transfers: self.max_transfers,
            upload_bytes_per_sec: self.max_upload_rate,
            download_bytes_per_sec: self.max_download_rate,
            requests_per_sec: self.max_request_rate,
        }
    }
}

impl Default for StoreSettings {
    fn default() -> Self {
        StoreSettings {
            kind: StoreKind::Local,
            local_dir: PathBuf::from("blobsnap-store"),
            max_transfers: 16,
            max_upload_rate: 0,
            max_download_rate: 0,
            max_request_rate: 0,
            pre_upload: false,
        }
    }
}

/// `[job]`: the settings of a job run by the runtime (the demo reads them; its flags win).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct JobConfig {
    /// The job's name.
    pub name: String,
    /// The job's id.
    pub id: String,
    /// Partitions (= tasks).
    pub partitions: u32,
    /// Commit every this many messages.
    pub commit_every: u64,
    /// Also commit every this many milliseconds (0: by count only).
    #[serde(deserialize_with = "crate::units::millis")]
    pub commit_ms: u64,
    /// Skip a due commit while one is in flight for at most this long, then wait.
    #[serde(deserialize_with = "crate::units::millis")]
    pub commit_max_delay_ms: u64,
    /// What the history keeps: a count of the newest checkpoints (`2`), or rules such as
    /// `"last 3, every 5m for 1d, every 1h for 7d"` ([`crate::retention::RetentionPolicy`]).
    pub retention: crate::retention::RetentionPolicy,
    /// Run on a store that cannot fence a second writer.
    pub unsafe_no_fencing: bool,
    /// Sweep every this many commits (0: never).
    pub sweep_every_commits: u64,
    /// The sweep's grace period, seconds (at least 60 for a running job).
    #[serde(deserialize_with = "crate::units::secs")]
    pub gc_grace_secs: u64,
    /// Restore the newest retained checkpoint that restores when the last one is corrupt or
    /// missing, and resume from its offsets (see `JobSettings::restore_fallback`).
    pub restore_fallback: bool,
    /// How a task's stores are restored at its start: "full" (default) or "lazy".
    pub restore_mode: crate::job::RestoreMode,
    /// A lazy restore's background download, bytes/s (`"200MiB/s"`); 0: no bound.
    #[serde(deserialize_with = "crate::units::rate")]
    pub lazy_download_rate: u64,
    /// Start every task from this point (see `JobSettings::start_from`): `savepoint:NAME`,
    /// `@2026-12-02T10:00Z`, `#N` (each task's own number; tasks' numbers diverge after
    /// restarts), a checkpoint id. Applied once per value.
    pub start_from: Option<String>,
    /// Apply `start-from` again under this id (see `JobSettings::start_from_id`).
    pub start_from_id: Option<String>,
    /// This deployment's id, recorded in the scope's owner record (`scope.json`): a job
    /// started with another id on the same scope is refused (two deployments sharing a scope
    /// would delete each other's blobs). Give each deployment of a job its own.
    pub deployment_id: String,
    /// Create the job's resources before the first commit (bucket if missing, the rule that
    /// aborts incomplete multipart uploads, the owner record). Off: they must exist (see
    /// `blobsnap admin create`); they are validated either way.
    pub create_resources: bool,
    /// Mutable files (MANIFEST, OPTIONS, CURRENT, WAL) smaller than this travel inline in
    /// the store's index (format-version 2) instead of as blobs of their own (default 64 KiB). 0 writes Samza's v1 index shape, for a
    /// Samza reader.
    #[serde(deserialize_with = "crate::units::bytes")]
    pub index_inline_below: u64,
}

impl Default for JobConfig {
    fn default() -> Self {
        JobConfig {
            name: "wordcount".into(),
            id: "1".into(),
            partitions: 4,
            commit_every: 2_500,
            commit_ms: 0,
            commit_max_delay_ms: 10_000,
            retention: crate::retention::RetentionPolicy::last(2),
            unsafe_no_fencing: false,
            sweep_every_commits: 20,
            gc_grace_secs: 86_400,
            restore_fallback: false,
            restore_mode: crate::job::RestoreMode::Full,
            lazy_download_rate: crate::local::lazy::DEFAULT_RATE,
            start_from: None,
            start_from_id: None,
            deployment_id: "default".into(),
            create_resources: true,
            index_inline_below: crate::blob::commit::backup::INLINE_BELOW,
        }
    }
}

/// All settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct Settings {
    /// Which store.
    pub store: StoreSettings,
    /// The job (runtime and demo).
    pub job: JobConfig,
    /// S3 settings (used when `store.kind = "s3"`).
    pub s3: S3Config,
    /// Retry policy of every store operation.
    pub retry: RetryPolicy,
    /// Prices for `blobsnap cost` (S3 Standard's list prices by default).
    pub cost: crate::blob::inspect::cost::Prices,
}

impl Settings {
    /// Parse TOML text.
    pub fn from_toml(text: &str) -> Result<Self> {
        toml::from_str(text).map_err(|e| Error::invalid(format!("bad settings: {e}")))
    }

    /// Load `path` (if given), then apply the environment.
    pub fn load(path: Option<&Path>) -> Result<Self> {
        let mut s = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| Error::io(format!("read settings {}", p.display()), e))?;
                Self::from_toml(&text).map_err(|e| e.context(p.display().to_string()))?
            }
            None => Settings::default(),
        };
        s.apply_env(|k| std::env::var(k).ok())?;
        Ok(s)
    }

    /// Apply `BLOBSNAP_*` variables read through `get`.
    pub fn apply_env(&mut self, get: impl Fn(&str) -> Option<String>) -> Result<()> {
        if let Some(v) = get("BLOBSNAP_STORE") {
            self.store.kind = match v.as_str() {
                "local" => StoreKind::Local,
                "s3" => StoreKind::S3,
                other => {
                    return Err(Error::invalid(format!(
                        "BLOBSNAP_STORE={other:?}: expected \"local\" or \"s3\""
                    )))
                }
            };
        }
        if let Some(v) = get("BLOBSNAP_JOB_PARTITIONS") {
            self.job.partitions = v.parse().map_err(|_| {
                Error::invalid(format!("BLOBSNAP_JOB_PARTITIONS={v:?}: not a number"))
            })?;
        }
        if let Some(v) = get("BLOBSNAP_JOB_COMMIT_EVERY") {
            self.job.commit_every = v.parse().map_err(|_| {
                Error::invalid(format!("BLOBSNAP_JOB_COMMIT_EVERY={v:?}: not a number"))
            })?;
        }
        if let Some(v) = get("BLOBSNAP_LOCAL_DIR") {
            self.store.local_dir = v.into();
        }
        if let Some(v) = get("BLOBSNAP_MAX_TRANSFERS") {
            self.store.max_transfers = v.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                Error::invalid(format!(
                    "BLOBSNAP_MAX_TRANSFERS={v:?}: expected a number of transfers (at least 1)"
                ))
            })?;
        }
        for (name, field) in [
            ("BLOBSNAP_MAX_UPLOAD_RATE", &mut self.store.max_upload_rate),
            (
                "BLOBSNAP_MAX_DOWNLOAD_RATE",
                &mut self.store.max_download_rate,
            ),
        ] {
            if let Some(v) = get(name) {
                *field = crate::units::parse_rate(&v)
                    .map_err(|why| Error::invalid(format!("{name}: {why}")))?;
            }
        }
        if let Some(v) = get("BLOBSNAP_MAX_REQUEST_RATE") {
            self.store.max_request_rate = v.parse().map_err(|_| {
                Error::invalid(format!(
                    "BLOBSNAP_MAX_REQUEST_RATE={v:?}: expected requests per second (0: no limit)"
                ))
            })?;
        }
        if let Some(v) = get("BLOBSNAP_PRE_UPLOAD") {
            self.store.pre_upload = parse_bool("BLOBSNAP_PRE_UPLOAD", &v)?;
        }
        if let Some(v) = get("BLOBSNAP_S3_BUCKET") {
            self.s3.bucket = v;
        }
        if let Some(v) = get("BLOBSNAP_S3_PREFIX") {
            self.s3.prefix = v;
        }
        if let Some(v) = get("BLOBSNAP_S3_ENDPOINT") {
            self.s3.endpoint = Some(v);
        }
        if let Some(v) = get("BLOBSNAP_S3_REGION") {
            self.s3.region = Some(v);
        }
        if let Some(v) = get("BLOBSNAP_S3_CA_BUNDLE") {
            self.s3.ca_bundle = Some(v.into());
        }
        if let Some(v) = get("BLOBSNAP_S3_RESOLVE") {
            self.s3.resolve = parse_resolve(&v)?;
        }
        if let Some(v) = get("BLOBSNAP_S3_PATH_STYLE") {
            self.s3.path_style = parse_bool("BLOBSNAP_S3_PATH_STYLE", &v)?;
        }
        if let Some(v) = get("BLOBSNAP_S3_MULTIPART_LISTING") {
            self.s3.multipart_listing = parse_bool("BLOBSNAP_S3_MULTIPART_LISTING", &v)?;
        }
        if let Some(v) = get("BLOBSNAP_S3_CREATE_ONLY") {
            self.s3.create_only = match v.as_str() {
                "auto" => CreateOnlySetting::Auto,
                "atomic" => CreateOnlySetting::Atomic,
                "racy" => CreateOnlySetting::Racy,
                "ignored" => CreateOnlySetting::Ignored,
                other => {
                    return Err(Error::invalid(format!(
                        "BLOBSNAP_S3_CREATE_ONLY={other:?}: expected auto, atomic, racy or ignored"
                    )))
                }
            };
        }
        Ok(())
    }

    /// Open the configured store: the retry layer over the process's one budget
    /// ([`LimitStore`]: `store.max-transfers`, the bandwidth and request-rate limits, the
    /// window that narrows when the store throttles) over the counting layer (which publishes
    /// requests by operation and outcome as metrics). Open it once per process and share the
    /// handle: every task and store then draws on the one budget.
    pub async fn open_store(&self) -> Result<Arc<dyn BlobStore>> {
        use crate::blobstore::counting::CountingStore;
        let budget = Budget::with_limits(self.store.limits());
        Ok(match self.store.kind {
            StoreKind::Local => Arc::new(RetryStore::new(
                LimitStore::new(
                    CountingStore::new(LocalStore::new(&self.store.local_dir)?),
                    budget,
                ),
                self.retry,
            )),
            StoreKind::S3 => Arc::new(RetryStore::new(
                LimitStore::new(
                    CountingStore::new(S3Store::connect(self.s3.clone()).await?),
                    budget,
                ),
                self.retry,
            )),
        })
    }
}

/// `name=ip,name=ip` of `BLOBSNAP_S3_RESOLVE` (names are checked with the rest of `[s3]`).
fn parse_resolve(v: &str) -> Result<std::collections::BTreeMap<String, std::net::IpAddr>> {
    let mut map = std::collections::BTreeMap::new();
    for entry in v.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let parsed = entry
            .split_once('=')
            .and_then(|(name, ip)| Some((name.trim(), ip.trim().parse().ok()?)));
        let Some((name, ip)) = parsed else {
            return Err(Error::invalid(format!(
                "BLOBSNAP_S3_RESOLVE: {entry:?} is not name=ip (an IPv4 or IPv6 address)"
            )));
        };
        map.insert(name.to_owned(), ip);
    }
    Ok(map)
}

fn parse_bool(name: &str, v: &str) -> Result<bool> {
    match v {
        "1" | "true" | "yes" => Ok(true),
        "0" | "false" | "no" => Ok(false),
        _ => Err(Error::invalid(format!(
            "{name}={v:?}: expected true or false"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_and_env() {
        let mut s = Settings::from_toml(
            "[store]\nkind = \"s3\"\n[s3]\nbucket = \"b-1\"\npath-style = true\n",
        )
        .unwrap();
        assert_eq!(s.store.kind, StoreKind::S3);
        assert!(s.s3.path_style);
        s.apply_env(|k| (k == "BLOBSNAP_S3_ENDPOINT").then(|| "http://127.0.0.1:1".to_string()))
            .unwrap();
        assert_eq!(s.s3.endpoint.as_deref(), Some("http://127.0.0.1:1"));
        assert!(Settings::from_toml("[s3]\nbukket = \"x\"\n").is_err());
        let j = Settings::from_toml("[job]\npartitions = 7\ncommit-ms = 500\n").unwrap();
        assert_eq!(
            (j.job.partitions, j.job.commit_ms, j.job.retention.last),
            (7, 500, 2)
        );
        assert!(s
            .apply_env(|k| (k == "BLOBSNAP_STORE").then(|| "ftp".to_string()))
            .is_err());
    }

    #[test]
    fn rate_limits_from_toml_and_env() {
        let mut s = Settings::from_toml(
            "[store]\nmax-upload-rate = \"50MiB/s\"\nmax-download-rate = 1048576\nmax-request-rate = 300\n",
        )
        .unwrap();
        let l = s.store.limits();
        assert_eq!(
            (
                l.transfers,
                l.upload_bytes_per_sec,
                l.download_bytes_per_sec,
                l.requests_per_sec
            ),
            (16, 50 << 20, 1 << 20, 300)
        );
        s.apply_env(|k| match k {
            "BLOBSNAP_MAX_DOWNLOAD_RATE" => Some("2 MiB/s".into()),
            "BLOBSNAP_MAX_REQUEST_RATE" => Some("0".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(
            (s.store.max_download_rate, s.store.max_request_rate),
            (2 << 20, 0)
        );
        let e = s
            .apply_env(|k| (k == "BLOBSNAP_MAX_UPLOAD_RATE").then(|| "quick".into()))
            .unwrap_err();
        assert!(e.to_string().contains("BLOBSNAP_MAX_UPLOAD_RATE"), "{e}");
        assert!(Settings::from_toml("[store]\nmax-upload-rate = \"fast\"\n").is_err());
        assert!(!s.store.pre_upload, "pre-upload is off by default");
        s.apply_env(|k| (k == "BLOBSNAP_PRE_UPLOAD").then(|| "true".into()))
            .unwrap();
        assert!(s.store.pre_upload);
        let e = s
            .apply_env(|k| (k == "BLOBSNAP_PRE_UPLOAD").then(|| "sometimes".into()))
            .unwrap_err();
        assert!(e.to_string().contains("BLOBSNAP_PRE_UPLOAD"), "{e}");
        let t = Settings::from_toml("[store]\npre-upload = true\n").unwrap();
        assert!(t.store.pre_upload);
    }

    #[test]
    fn resolve_from_toml_and_env() {
        let mut s = Settings::from_toml(
            "[s3]\nbucket = \"b-1\"\n[s3.resolve]\n\"s3.internal\" = \"10.0.0.5\"\n\"*.s3.internal\" = \"::1\"\n",
        )
        .unwrap();
        assert_eq!(s.s3.resolve.len(), 2);
        assert_eq!(s.s3.resolve["*.s3.internal"].to_string(), "::1");
        s.s3.validate().unwrap();
        s.apply_env(|k| {
            (k == "BLOBSNAP_S3_RESOLVE").then(|| "a.test=127.0.0.1, *.a.test=127.0.0.2".into())
        })
        .unwrap();
        assert_eq!(
            s.s3.resolve
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>(),
            ["*.a.test=127.0.0.2", "a.test=127.0.0.1"]
        );
        for bad in ["a.test", "a.test=localhost", "=1.2.3.4x"] {
            let err = s
                .apply_env(|k| (k == "BLOBSNAP_S3_RESOLVE").then(|| bad.into()))
                .unwrap_err();
            assert!(
                err.to_string().contains("BLOBSNAP_S3_RESOLVE"),
                "{bad}: {err}"
            );
        }
        for bad in ["Upper.test", "a..b", "*.", "a.*.b", "*"] {
            let mut c = s.s3.clone();
            c.resolve = [(bad.to_owned(), "127.0.0.1".parse().unwrap())].into();
            let err = c.validate().unwrap_err();
            assert!(err.to_string().contains("s3 resolve"), "{bad}: {err}");
        }
        assert!(Settings::from_toml("[s3.resolve]\n\"a.test\" = \"not-an-ip\"\n").is_err());
    }

    #[test]
    fn sizes_and_durations_as_people_write_them() {
        let s = Settings::from_toml(
            "[s3]\nbucket = \"b-1\"\npart-size = \"16MiB\"\nmultipart-threshold = \"64 MiB\"\nread-timeout-ms = \"30s\"\nconnect-timeout-ms = 2500\n[retry]\nbudget-ms = \"2m\"\n[job]\ngc-grace-secs = \"24h\"\ncommit-ms = \"1m\"\n",
        )
        .unwrap();
        assert_eq!(
            (s.s3.part_size, s.s3.multipart_threshold),
            (16 << 20, 64 << 20)
        );
        assert_eq!(
            (s.s3.read_timeout_ms, s.s3.connect_timeout_ms),
            (30_000, 2_500)
        );
        assert_eq!(s.retry.budget_ms, 120_000);
        assert_eq!((s.job.gc_grace_secs, s.job.commit_ms), (86_400, 60_000));
        let e = Settings::from_toml("[s3]\npart-size = \"16 parsecs\"\n").unwrap_err();
        assert!(e.to_string().contains("16 parsecs"), "{e}");
    }
}
