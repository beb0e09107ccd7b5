//! blobsnap side by side with rclone and restic, on the same S3 server and the same RocksDB
//! store, in one run. Driven by `benches/compare.sh` (which builds the release binary and
//! starts the servers); run alone:
//!
//! ```sh
//! BLOBSNAP_BIN=target/release/blobsnap cargo bench --bench compare -- \
//!     [--size-mib 2048] [--reps 3] [--servers garage:2,s3s:1,localstack:1] [--work DIR] [--micro]
//!     [--scaling 1024,8192]
//! ```
//!
//! For each server, each repetition starts from the same pristine store and runs, with the
//! order of the tools rotating from one repetition to the next:
//! 1. a full backup (blobsnap `backup`, `rclone copy`, `restic backup`);
//! 2. an incremental backup after 5 % new data and a memtable flush;
//! 3. a restore into an empty directory (blobsnap `restore`, `rclone copy`, `restic restore`);
//! 4. a restore into a directory that already holds ~90 % of the bytes (blobsnap; `rclone
//!    sync`);
//! 5. the limit line: the fastest parallel PUT and GET of the same SST bytes through
//!    blobsnap's S3 layer (32 parts in flight), no hashing, no disk writes on GET.
//!
//! Every tool is a process, timed wall-clock, with its peak RSS taken by `/usr/bin/time`.
//! One extra, untimed repetition runs every tool through the counting HTTP proxy of the test
//! harness to count requests and bytes sent and received. `--micro` adds: SHA-256 hashing vs
//! `openssl dgst -sha256`, the sync snapshot step on a store of 200 SSTs, and the memtable
//! flush cost per MiB.
//!
//! `--servers` takes `name` or `name:reps`. Servers: `garage` and `localstack` read their endpoint and keys from `minio/<name>.sh env`
//! (started by the script); `s3s` is the in-process s3s-fs server of the test harness.

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use blobsnap::backend::StoreEngine as _;
use blobsnap::blobstore::s3::{CreateOnlySetting, S3Config, S3Store};
use blobsnap::blobstore::{BlobKey, BlobStore, PutBody, PutOptions};
use blobsnap::local::rocks::RocksStore;
use common::{arg, dir_size, fill, mbps, median};
use futures::{StreamExt as _, TryStreamExt as _};

const TOOLS: [&str; 3] = ["blobsnap", "rclone", "restic"];

struct Server {
    name: String,
    endpoint: String,
    upstream: SocketAddr,
    region: String,
    access_key: String,
    secret_key: String,
    bucket: String,
    create_only: &'static str,
    multipart_listing: bool,
    /// Extra `[s3]` settings lines for blobsnap on this server.
    extra: &'static str,
    /// rclone's downloads crawl on this server (s3s-fs: 3-11 MiB/s, measured): its restores
    /// are skipped.
    slow_ranged_gets: bool,
    _guard: Option<tempfile::TempDir>,
}

#[derive(Clone, Debug, Default)]
struct Measure {
    secs: f64,
    rss_kib: u64,
    requests: u64,
    up: u64,
    down: u64,
}

fn sh_env(script: &str) -> BTreeMap<String, String> {
    let out = std::process::Command::new("bash")
        .arg(format!("{}/minio/{script}", env!("CARGO_MANIFEST_DIR")))
        .arg("env")
        .output()
        .expect("run the server script");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

async fn server(name: &str, work: &Path) -> Server {
    let addr_of = |endpoint: &str| -> SocketAddr {
        endpoint
            .trim_start_matches("http://")
            .parse()
            .expect("endpoint host:port")
    };
    match name {
        "s3s" => {
            let dir = tempfile::tempdir_in(work).expect("tempdir");
            let addr = support::start_s3s(dir.path()).await;
            Server {
                name: "s3s-fs 0.14 (in-process)".into(),
                endpoint: format!("http://{addr}"),
                upstream: addr,
                region: "us-east-1".into(),
                access_key: support::S3S_ACCESS_KEY.into(),
                secret_key: support::S3S_SECRET_KEY.into(),
                bucket: "bench".into(),
                create_only: "racy",
                multipart_listing: false,
                // s3s-fs 0.14 answers 500 to multipart uploads of keys over ~140 bytes
                // (blobsnap's blob keys are longer): single PUTs only.
                extra: "multipart-threshold = 4294967296\n",
                slow_ranged_gets: true,
                _guard: Some(dir),
            }
        }
        "garage" | "localstack" => {
            let env = sh_env(&format!("{name}.sh"));
            let endpoint = env["BLOBSNAP_TEST_S3_ENDPOINT"].clone();
            Server {
                name: if name == "garage" {
                    "Garage 2.5, 1 node (fsync on)".into()
                } else {
                    "LocalStack 2026.3".into()
                },
                upstream: addr_of(&endpoint),
                endpoint,
                region: env["BLOBSNAP_TEST_S3_REGION"].clone(),
                access_key: env["BLOBSNAP_TEST_S3_ACCESS_KEY"].clone(),
                secret_key: env["BLOBSNAP_TEST_S3_SECRET_KEY"].clone(),
                bucket: "bench".into(),
                create_only: if name == "garage" {
                    "ignored"
                } else {
                    "atomic"
                },
                multipart_listing: true,
                extra: "",
                slow_ranged_gets: false,
                _guard: None,
            }
        }
        other => panic!("unknown server {other} (garage, s3s, localstack)"),
    }
}

impl Server {
    fn config(&self, endpoint: &str) -> S3Config {
        let single_puts = !self.extra.is_empty();
        S3Config {
            multipart_threshold: if single_puts { 4 << 30 } else { 64 << 20 },
            bucket: self.bucket.clone(),
            endpoint: Some(endpoint.to_string()),
            region: Some(self.region.clone()),
            path_style: true,
            create_only: CreateOnlySetting::Ignored,
            multipart_listing: self.multipart_listing,
            part_concurrency: 8,
            ..Default::default()
        }
    }

    async fn store(&self, endpoint: &str) -> S3Store {
        S3Store::connect_with_credentials(
            self.config(endpoint),
            &self.access_key,
            &self.secret_key,
            None,
        )
        .await
        .expect("connect")
    }

    async fn create_bucket(&self) {
        let s = self.store(&self.endpoint).await;
        let _ = s.client().create_bucket().bucket(&self.bucket).send().await;
    }

    /// The blobsnap settings file for `endpoint` (the server, or the counting proxy).
    fn blobsnap_config(&self, dir: &Path, endpoint: &str) -> PathBuf {
        let path = dir.join(format!(
            "blobsnap-{}.toml",
            endpoint.replace([':', '/'], "_")
        ));
        std::fs::write(
            &path,
            format!(
                "[store]\nkind = \"s3\"\n\n[s3]\nbucket = \"{}\"\nendpoint = \"{endpoint}\"\nregion = \"{}\"\npath-style = true\ncreate-only = \"{}\"\nmultipart-listing = {}\n{}",
                self.bucket, self.region, self.create_only, self.multipart_listing, self.extra
            ),
        )
        .expect("write config");
        path
    }
}

/// Run `cmd` under `/usr/bin/time`, fail loudly if it fails; wall time and peak RSS.
async fn timed(cmd: std::process::Command, what: &str) -> (Measure, String) {
    let rss_file = tempfile::NamedTempFile::new().expect("tempfile");
    let mut wrapped = tokio::process::Command::new("/usr/bin/time");
    wrapped
        .arg("-f")
        .arg("%M")
        .arg("-o")
        .arg(rss_file.path())
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => wrapped.env(k, v),
            None => wrapped.env_remove(k),
        };
    }
    if let Some(d) = cmd.get_current_dir() {
        wrapped.current_dir(d);
    }
    let t = Instant::now();
    let out = wrapped.output().await.expect("spawn");
    let secs = t.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let rss_kib = std::fs::read_to_string(rss_file.path())
        .ok()
        .and_then(|s| s.lines().last().and_then(|l| l.trim().parse().ok()))
        .unwrap_or(0);
    (
        Measure {
            secs,
            rss_kib,
            ..Default::default()
        },
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

struct Ctx<'a> {
    server: &'a Server,
    bin: PathBuf,
    work: PathBuf,
    pristine: PathBuf,
    keys: u64,
    size_mib: u64,
}

impl Ctx<'_> {
    fn blobsnap(&self, endpoint: &str) -> std::process::Command {
        let config = self.server.blobsnap_config(&self.work, endpoint);
        let mut c = std::process::Command::new(&self.bin);
        c.arg("--json")
            .arg("--config")
            .arg(config)
            .env("AWS_ACCESS_KEY_ID", &self.server.access_key)
            .env("AWS_SECRET_ACCESS_KEY", &self.server.secret_key)
            .env("RUST_LOG", "warn");
        c
    }

    fn rclone_remote(&self, endpoint: &str, path: &str) -> String {
        format!(
            ":s3,provider=Other,endpoint='{endpoint}',region={},force_path_style=true,env_auth=true:{}/{path}",
            self.server.region, self.server.bucket
        )
    }

    fn rclone(&self) -> std::process::Command {
        let mut c = std::process::Command::new("rclone");
        c.env_remove("AWS_CA_BUNDLE")
            .env("RCLONE_CONFIG", self.work.join("rclone.conf"))
            .env("AWS_ACCESS_KEY_ID", &self.server.access_key)
            .env("AWS_SECRET_ACCESS_KEY", &self.server.secret_key)
            // Tuned: 16 files at once, 16 MiB parts, 4 parts in flight per file, no MD5 pass.
            .args([
                "--transfers",
                "16",
                "--checkers",
                "16",
                "--s3-chunk-size",
                "16M",
                "--s3-upload-concurrency",
                "4",
                "--s3-disable-checksum",
                "--multi-thread-streams",
                "4",
            ]);
        c
    }

    fn restic(&self, endpoint: &str, repo: &str) -> std::process::Command {
        let mut c = std::process::Command::new("restic");
        c.env_remove("AWS_CA_BUNDLE")
            .env(
                "RESTIC_REPOSITORY",
                format!("s3:{endpoint}/{}/{repo}", self.server.bucket),
            )
            .env("RESTIC_PASSWORD", "bench")
            .env("AWS_ACCESS_KEY_ID", &self.server.access_key)
            .env("AWS_SECRET_ACCESS_KEY", &self.server.secret_key)
            .args(["-o", &format!("s3.region={}", self.server.region)])
            .args(["--cache-dir"])
            .arg(self.work.join("restic-cache"))
            .arg("--quiet");
        c
    }
}

fn copy_dir(from: &Path, to: &Path) {
    let st = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("cp");
    assert!(st.success(), "cp -a {} {}", from.display(), to.display());
}

fn rm(p: &Path) {
    if p.exists() {
        std::fs::remove_dir_all(p).expect("rm -r");
    }
}

/// Remove SST files of `dir` until ~10 % of its bytes are gone (every 10th by name, then more
/// if needed); returns the bytes removed.
fn drop_tenth(dir: &Path) -> u64 {
    let mut ssts: Vec<(PathBuf, u64)> = walk(dir)
        .into_iter()
        .filter(|(p, _)| p.extension().is_some_and(|e| e == "sst"))
        .collect();
    ssts.sort();
    let total: u64 = walk(dir).iter().map(|(_, l)| l).sum();
    let mut removed = 0;
    for (i, (p, len)) in ssts.iter().enumerate() {
        if removed >= total / 10 {
            break;
        }
        if i % 3 == 0 {
            std::fs::remove_file(p).expect("rm");
            removed += len;
        }
    }
    removed
}

fn walk(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read dir").flatten() {
            let md = e.metadata().expect("stat");
            if md.is_dir() {
                stack.push(e.path());
            } else {
                out.push((e.path(), md.len()));
            }
        }
    }
    out
}

fn open_db(dir: &Path) -> RocksStore {
    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(true);
    opts.set_compression_type(rocksdb::DBCompressionType::None);
    opts.set_write_buffer_size(128 << 20);
    opts.set_target_file_size_base(64 << 20);
    opts.set_max_bytes_for_level_base(512 << 20);
    RocksStore::open_with("bench", dir, &opts).expect("open db")
}

/// The pristine store: `size_mib` of random 16 KiB values, compacted into ~64 MiB SSTs.
fn generate(dir: &Path, size_mib: u64) -> u64 {
    if dir.join("KEYS").exists() {
        return std::fs::read_to_string(dir.join("KEYS"))
            .expect("KEYS")
            .trim()
            .parse()
            .expect("KEYS");
    }
    rm(dir);
    let db = open_db(&dir.join("db"));
    let keys = fill(&db, 0, size_mib << 20, 1);
    db.flush().expect("flush");
    db.db().compact_range::<&[u8], &[u8]>(None, None);
    drop(db);
    std::fs::write(dir.join("KEYS"), keys.to_string()).expect("KEYS");
    keys
}

/// 5 % new data, flushed (RocksDB's own compactions may follow).
fn mutate(db_dir: &Path, keys: u64, size_mib: u64, seed: u64) -> u64 {
    let db = open_db(db_dir);
    let n = fill(&db, keys, (size_mib << 20) / 20, seed);
    db.flush().expect("flush");
    drop(db);
    n * (16 << 10)
}

/// Bytes of files present in `dir` but not (same name and size) in `before`.
fn new_bytes(before: &[(PathBuf, u64)], after: &Path) -> u64 {
    let old: std::collections::BTreeSet<(String, u64)> = before
        .iter()
        .map(|(p, l)| (p.file_name().unwrap().to_string_lossy().into(), *l))
        .collect();
    walk(after)
        .into_iter()
        .filter(|(p, l)| !old.contains(&(p.file_name().unwrap().to_string_lossy().into(), *l)))
        .map(|(_, l)| l)
        .sum()
}

type Results = BTreeMap<(String, String), Vec<Measure>>;

/// One repetition of scenarios 1-4 for every tool; `endpoint` is the server or the proxy.
async fn repetition(
    ctx: &Ctx<'_>,
    rep: usize,
    endpoint: &str,
    proxy: Option<&support::proxy::Proxy>,
    results: &mut Results,
) -> BTreeMap<String, u64> {
    let mut facts = BTreeMap::new();
    let (pristine, keys, size_mib) = (&ctx.pristine, ctx.keys, ctx.size_mib);
    let w = &ctx.work;
    let db = w.join("db");
    rm(&db);
    copy_dir(&pristine.join("db"), &db);
    let tag = format!("r{rep}-{:08x}", rand::random::<u32>());
    let mut order: Vec<&str> = TOOLS.to_vec();
    order.rotate_left(rep % TOOLS.len());
    rm(&w.join("restic-cache"));
    let mut restic_init = ctx.restic(endpoint, &format!("restic-{tag}"));
    restic_init.arg("init");
    timed(restic_init, "restic init").await;

    let mut record = |scenario: &str,
                      tool: &str,
                      mut m: Measure,
                      before: Option<(u64, u64, u64)>| {
        if let (Some(p), Some((r0, u0, d0))) = (proxy, before) {
            let (r, u, d) = p.stats.snapshot();
            m.requests = r - r0;
            m.up = u - u0;
            m.down = d - d0;
        }
        eprintln!(
            "  {scenario:<12} {tool:<9} {:>7.2} s  rss {:>6} MiB  req {:>6}  up {:>8.1} MiB  down {:>8.1} MiB",
            m.secs,
            m.rss_kib / 1024,
            m.requests,
            m.up as f64 / 1048576.0,
            m.down as f64 / 1048576.0
        );
        results
            .entry((scenario.to_string(), tool.to_string()))
            .or_default()
            .push(m);
    };
    let snap = || proxy.map(|p| p.stats.snapshot());

    // 1. Full backup.
    let mut markers = Vec::new();
    for tool in &order {
        let before = snap();
        let m = match *tool {
            "blobsnap" => {
                let mut c = ctx.blobsnap(endpoint);
                c.args(["backup", "--db"])
                    .arg(&db)
                    .args(["--name", &format!("bench-{tag}")]);
                let (m, out) = timed(c, "blobsnap backup").await;
                let v: serde_json::Value = serde_json::from_str(&out).expect("backup json");
                markers.push(v["marker"].as_str().expect("marker").to_string());
                m
            }
            "rclone" => {
                let mut c = ctx.rclone();
                c.arg("copy")
                    .arg(&db)
                    .arg(ctx.rclone_remote(endpoint, &format!("rclone-{tag}")));
                timed(c, "rclone copy").await.0
            }
            _ => {
                let mut c = ctx.restic(endpoint, &format!("restic-{tag}"));
                c.args(["backup", "--host", "bench"]).arg(&db);
                timed(c, "restic backup").await.0
            }
        };
        record("full backup", tool, m, before);
    }

    // 2. Incremental: 5 % new data, flushed.
    let before_files = walk(&db);
    let written = mutate(&db, keys, size_mib, 1000 + rep as u64);
    let fresh = new_bytes(&before_files, &db);
    facts.insert("incremental new data written".into(), written);
    facts.insert("incremental new file bytes".into(), fresh);
    for tool in &order {
        let before = snap();
        let m = match *tool {
            "blobsnap" => {
                let mut c = ctx.blobsnap(endpoint);
                c.args(["backup", "--db"])
                    .arg(&db)
                    .args(["--name", &format!("bench-{tag}")]);
                let (m, out) = timed(c, "blobsnap backup (incremental)").await;
                let v: serde_json::Value = serde_json::from_str(&out).expect("backup json");
                markers.push(v["marker"].as_str().expect("marker").to_string());
                facts.insert(
                    "blobsnap incremental uploaded bytes".into(),
                    v["uploaded-bytes"].as_u64().unwrap_or(0),
                );
                m
            }
            "rclone" => {
                let mut c = ctx.rclone();
                c.arg("copy")
                    .arg(&db)
                    .arg(ctx.rclone_remote(endpoint, &format!("rclone-{tag}")));
                timed(c, "rclone copy (incremental)").await.0
            }
            _ => {
                let mut c = ctx.restic(endpoint, &format!("restic-{tag}"));
                c.args(["backup", "--host", "bench"]).arg(&db);
                timed(c, "restic backup (incremental)").await.0
            }
        };
        record("incremental", tool, m, before);
    }

    // 3. Restore into an empty directory.
    let marker = markers.last().expect("a blobsnap marker").clone();
    let restored = |tool: &str| w.join(format!("restore-{tool}"));
    for tool in &order {
        let to = restored(tool);
        rm(&to);
        let before = snap();
        let m = match *tool {
            "blobsnap" => {
                let mut c = ctx.blobsnap(endpoint);
                c.args(["restore", &marker, "--job", "manual", "--job-id"])
                    .arg(format!("bench-{tag}"))
                    .args(["--task", "backup", "--store", "db", "--to"])
                    .arg(&to);
                timed(c, "blobsnap restore").await.0
            }
            "rclone" if ctx.server.slow_ranged_gets => {
                eprintln!("  restore      rclone    skipped on this server (see below)");
                continue;
            }
            "rclone" => {
                let mut c = ctx.rclone();
                c.arg("copy")
                    .arg(ctx.rclone_remote(endpoint, &format!("rclone-{tag}")))
                    .arg(&to);
                let (copy, _) = timed(c, "rclone copy (restore)").await;
                // rclone neither verifies nor fsyncs: "rclone + sync" adds the `sync` that
                // makes its copy as durable as blobsnap's restore.
                let mut s = std::process::Command::new("sync");
                s.arg("-f").arg(&to);
                let (synced, _) = timed(s, "sync after rclone copy").await;
                let with_sync = Measure {
                    secs: copy.secs + synced.secs,
                    rss_kib: copy.rss_kib,
                    ..Default::default()
                };
                if proxy.is_none() {
                    record("restore", "rclone + sync", with_sync, None);
                }
                copy
            }
            _ => {
                let mut c = ctx.restic(endpoint, &format!("restic-{tag}"));
                c.args(["restore", "latest", "--target"]).arg(&to);
                timed(c, "restic restore").await.0
            }
        };
        if !to.exists() {
            continue;
        }
        let got = dir_size(&to);
        assert!(
            got as f64 >= 0.95 * (size_mib << 20) as f64,
            "{tool} restored only {got} bytes"
        );
        record("restore", tool, m, before);
    }

    // 4. Restore into a directory holding ~90 % of the bytes.
    for tool in ["blobsnap", "rclone"] {
        if tool == "rclone" && ctx.server.slow_ranged_gets {
            continue;
        }
        let to = w.join(format!("partial-{tool}"));
        rm(&to);
        copy_dir(&restored(tool), &to);
        let removed = drop_tenth(&to);
        facts.insert(format!("{tool} 90 % restore: bytes missing"), removed);
        let before = snap();
        let m = match tool {
            "blobsnap" => {
                let mut c = ctx.blobsnap(endpoint);
                c.args(["restore", &marker, "--job", "manual", "--job-id"])
                    .arg(format!("bench-{tag}"))
                    .args(["--task", "backup", "--store", "db", "--to"])
                    .arg(&to);
                timed(c, "blobsnap restore (90 % present)").await.0
            }
            _ => {
                let mut c = ctx.rclone();
                c.arg("sync")
                    .arg(ctx.rclone_remote(endpoint, &format!("rclone-{tag}")))
                    .arg(&to);
                timed(c, "rclone sync (90 % present)").await.0
            }
        };
        record("restore 90 %", tool, m, before);
        rm(&to);
    }
    for tool in TOOLS {
        rm(&restored(tool));
    }
    rm(&w.join("restic-cache"));
    // Free the server's disk (and LocalStack's memory) for the next repetition.
    let store = ctx.server.store(&ctx.server.endpoint).await;
    for prefix in [
        format!("manual/bench-{tag}/"),
        format!("rclone-{tag}/"),
        format!("restic-{tag}/"),
    ] {
        delete_prefix(&store, prefix).await;
    }
    facts
}

/// Delete every object under `prefix` (best effort: it only frees the server's disk).
async fn delete_prefix(store: &S3Store, prefix: String) {
    let scope = blobsnap::blobstore::Scope::new(prefix).expect("scope");
    let keys: Vec<BlobKey> = blobsnap::blobstore::list_all(store, &scope)
        .await
        .expect("list")
        .into_iter()
        .map(|m| m.key)
        .collect();
    for chunk in keys.chunks(1000) {
        let _ = store.delete_many(chunk).await;
    }
}

/// The limit line: parallel PUTs and GETs of the store's SST bytes through the S3 layer.
async fn limit_line(server: &Server, db: &Path, results: &mut Results) {
    let store = Arc::new(server.store(&server.endpoint).await);
    let files: Vec<(PathBuf, u64)> = walk(db)
        .into_iter()
        .filter(|(p, _)| p.extension().is_some_and(|e| e == "sst"))
        .collect();
    let total: u64 = files.iter().map(|(_, l)| l).sum();
    let prefix = format!("limit-{:08x}", rand::random::<u32>());
    let keys: Vec<BlobKey> = (0..files.len())
        .map(|i| BlobKey::new(format!("{prefix}/{i}")).expect("key"))
        .collect();
    let t = Instant::now();
    futures::stream::iter(files.iter().zip(&keys).map(|((p, len), k)| {
        let store = Arc::clone(&store);
        async move {
            store
                .put(
                    k,
                    PutBody::File {
                        path: p.clone(),
                        len: *len,
                    },
                    PutOptions::default(),
                )
                .await
        }
    }))
    .buffer_unordered(4)
    .try_collect::<Vec<_>>()
    .await
    .expect("limit PUT");
    let put_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let chunk = 16u64 << 20;
    let ranges: Vec<(BlobKey, std::ops::Range<u64>)> = files
        .iter()
        .zip(&keys)
        .flat_map(|((_, len), k)| {
            (0..len.div_ceil(chunk))
                .map(move |i| (k.clone(), i * chunk..((i + 1) * chunk).min(*len)))
        })
        .collect();
    let got: u64 = futures::stream::iter(ranges.into_iter().map(|(k, r)| {
        let store = Arc::clone(&store);
        async move {
            let g = store.get(&k, Some(r)).await?;
            g.body
                .try_fold(0u64, |n, b| async move { Ok(n + b.len() as u64) })
                .await
        }
    }))
    .buffer_unordered(16)
    .try_fold(0u64, |a, b| async move { Ok(a + b) })
    .await
    .expect("limit GET");
    let get_s = t.elapsed().as_secs_f64();
    assert_eq!(got, total);
    let _ = store.delete_many(&keys).await;
    eprintln!(
        "  limit       PUT {:.1} MiB/s  GET {:.1} MiB/s ({} files, {:.0} MiB)",
        mbps(total, put_s),
        mbps(total, get_s),
        files.len(),
        total as f64 / 1048576.0
    );
    // The disk's own line: 1 GiB written sequentially and fdatasynced, in this run.
    let dd_file = db.with_file_name("dd-line");
    let mut dd = std::process::Command::new("dd");
    dd.arg("if=/dev/zero")
        .arg(format!("of={}", dd_file.display()))
        .args(["bs=1M", "count=1024", "conv=fdatasync", "status=none"]);
    let (disk, _) = timed(dd, "dd fdatasync").await;
    let _ = std::fs::remove_file(&dd_file);
    eprintln!(
        "  limit       disk {:.1} MiB/s (dd, fdatasync)",
        mbps(1 << 30, disk.secs)
    );
    results
        .entry(("limit disk".to_string(), "dd fdatasync".to_string()))
        .or_default()
        .push(Measure {
            secs: disk.secs * total as f64 / (1u64 << 30) as f64,
            ..Default::default()
        });
    for (s, secs) in [("limit PUT", put_s), ("limit GET", get_s)] {
        results
            .entry((s.to_string(), "S3 layer".to_string()))
            .or_default()
            .push(Measure {
                secs,
                ..Default::default()
            });
    }
}

fn report(server: &Server, size: u64, results: &Results, facts: &BTreeMap<String, u64>) {
    println!("\n### {}\n", server.name);
    println!("| scenario | tool | median s | MiB/s | × blobsnap time | peak RSS MiB | requests | sent MiB | received MiB |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let med = |s: &str, t: &str| -> Option<f64> {
        results
            .get(&(s.to_string(), t.to_string()))
            .map(|v| median(v.iter().filter(|m| m.secs > 0.0).map(|m| m.secs).collect()))
    };
    for scenario in [
        "full backup",
        "incremental",
        "restore",
        "restore 90 %",
        "limit PUT",
        "limit GET",
        "limit disk",
    ] {
        for tool in [
            "blobsnap",
            "rclone",
            "rclone + sync",
            "restic",
            "S3 layer",
            "dd fdatasync",
        ] {
            let Some(v) = results.get(&(scenario.to_string(), tool.to_string())) else {
                continue;
            };
            let timed: Vec<&Measure> = v
                .iter()
                .filter(|m| m.rss_kib > 0 || tool == "S3 layer" || tool == "dd fdatasync")
                .collect();
            let counted = v.iter().find(|m| m.requests > 0);
            let secs = med(scenario, tool).unwrap_or(f64::NAN);
            let ratio = med(scenario, "blobsnap").map(|b| secs / b);
            let rss = timed.iter().map(|m| m.rss_kib).max().unwrap_or(0) / 1024;
            let bytes = if scenario.starts_with("incremental") {
                None
            } else {
                Some(size)
            };
            println!(
                "| {scenario} | {tool} | {secs:.2} | {} | {} | {} | {} | {} | {} |",
                bytes.map_or("–".into(), |b| format!("{:.0}", mbps(b, secs))),
                ratio.map_or("–".into(), |r| format!("{r:.2}")),
                if rss > 0 {
                    rss.to_string()
                } else {
                    "–".into()
                },
                counted.map_or("–".into(), |m| m.requests.to_string()),
                counted.map_or("–".into(), |m| format!("{:.1}", m.up as f64 / 1048576.0)),
                counted.map_or("–".into(), |m| format!(
                    "{:.1}",
                    m.down as f64 / 1048576.0
                )),
            );
        }
    }
    // Issue 18 §3: a verified, fsynced restore against the lines of the same run.
    if let (Some(b), Some(get), Some(disk)) = (
        med("restore", "blobsnap"),
        med("limit GET", "S3 layer"),
        med("limit disk", "dd fdatasync"),
    ) {
        let line = get.max(disk);
        println!(
            "\n- restore vs the line min(GET, disk) = {:.0} MiB/s: {:.2}× (target ≥ 0.9)",
            mbps(size, line),
            line / b
        );
        for (tool, target) in [("rclone + sync", 1.0), ("restic", 1.5)] {
            if let Some(t) = med("restore", tool) {
                println!(
                    "- restore vs {tool}: {:.2}× faster (target ≥ {target})",
                    t / b
                );
            }
        }
    }
    println!();
    for (k, v) in facts {
        println!("- {k}: {:.1} MiB", *v as f64 / 1048576.0);
    }
}

/// Hashing vs openssl, the sync snapshot step on 200 SSTs, the memtable flush cost.
async fn micro(work: &Path, pristine: &Path) {
    println!("\n### Micro-benchmarks\n");
    // Hashing: the largest SSTs, 1 GiB or less, warm in the page cache.
    let mut ssts: Vec<(PathBuf, u64)> = walk(&pristine.join("db"))
        .into_iter()
        .filter(|(p, _)| p.extension().is_some_and(|e| e == "sst"))
        .collect();
    ssts.sort_by_key(|(_, l)| std::cmp::Reverse(*l));
    let mut files = Vec::new();
    let mut bytes = 0;
    for (p, l) in ssts {
        if bytes >= 1 << 30 {
            break;
        }
        bytes += l;
        files.push(p);
    }
    let mut ours = Vec::new();
    let mut openssl = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        for f in &files {
            blobsnap::digest::hash_file(f).expect("hash");
        }
        ours.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let st = std::process::Command::new("openssl")
            .args(["dgst", "-sha256"])
            .args(&files)
            .stdout(std::process::Stdio::null())
            .status()
            .expect("openssl");
        assert!(st.success());
        openssl.push(t.elapsed().as_secs_f64());
    }
    let (o, s) = (median(ours), median(openssl));
    println!(
        "- SHA-256 (+ CRC32C) of {:.0} MiB: blobsnap {:.0} MiB/s, `openssl dgst -sha256` {:.0} MiB/s: ratio {:.2}",
        bytes as f64 / 1048576.0,
        mbps(bytes, o),
        mbps(bytes, s),
        s / o
    );

    // The sync snapshot step on a store of 200 SSTs (empty memtable), and flush cost.
    let dir = work.join("sst200");
    rm(&dir);
    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(true);
    opts.set_compression_type(rocksdb::DBCompressionType::None);
    opts.set_disable_auto_compactions(true);
    let db = RocksStore::open_with("sst200", &dir, &opts).expect("open");
    for i in 0..200u64 {
        fill(&db, i * 64, 1 << 20, i);
        db.flush().expect("flush");
    }
    let n_sst = walk(&dir)
        .iter()
        .filter(|(p, _)| p.extension().is_some_and(|e| e == "sst"))
        .count();
    let mut steps = Vec::new();
    for i in 0..21 {
        let cp = work.join(format!("sst200-cp{i}"));
        let t = Instant::now();
        db.flush().expect("flush");
        db.checkpoint_to(&cp).expect("checkpoint");
        steps.push(t.elapsed().as_secs_f64() * 1000.0);
        rm(&cp);
    }
    let mut flush_ms_per_mib = Vec::new();
    for i in 0..5u64 {
        fill(&db, 1_000_000 + i * 4096, 64 << 20, 77 + i);
        let t = Instant::now();
        db.flush().expect("flush");
        flush_ms_per_mib.push(t.elapsed().as_secs_f64() * 1000.0 / 64.0);
    }
    drop(db);
    rm(&dir);
    println!(
        "- sync snapshot step (flush of an empty memtable + RocksDB checkpoint) on {n_sst} SSTs: median {:.2} ms over 21",
        median(steps)
    );
    println!(
        "- memtable flush: median {:.2} ms per MiB (64 MiB memtables, no compression)",
        median(flush_ms_per_mib)
    );
}

/// The same ~100 MiB delta committed on stores of each size in `sizes` (MiB): blobsnap only,
/// on one server. Full backup, then 3 incremental backups of ~100 MiB of new data each
/// (median), then a restore into an empty directory; wall time and peak RSS of each.
async fn scaling(server: &Server, bin: &Path, work: &Path, sizes: &[u64]) {
    println!(
        "\n### The same ~100 MiB delta on stores of different sizes ({}, blobsnap)\n",
        server.name
    );
    println!("| store MiB | files | full backup s | full backup peak RSS MiB | new file bytes per delta, MiB | incremental s (median of 3) | incremental peak RSS MiB | restore s | restore peak RSS MiB |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut incremental = Vec::new();
    for &size_mib in sizes {
        let dir = work.join(format!("scale-{size_mib}"));
        let t = Instant::now();
        let keys = generate(&dir, size_mib);
        let db = dir.join("db");
        eprintln!(
            "== scaling: {size_mib} MiB store ready in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        let ctx = Ctx {
            server,
            bin: bin.to_path_buf(),
            work: work.to_path_buf(),
            pristine: dir.clone(),
            keys,
            size_mib,
        };
        let tag = format!("scale-{size_mib}-{:08x}", rand::random::<u32>());
        let backup = |what: &'static str| {
            let mut c = ctx.blobsnap(&server.endpoint);
            c.args(["backup", "--db"]).arg(&db).args(["--name", &tag]);
            timed(c, what)
        };
        let (full, _) = backup("blobsnap backup (scaling, full)").await;
        let (mut secs, mut rss, mut fresh) = (Vec::new(), 0, Vec::new());
        let mut marker = String::new();
        for rep in 0..3u64 {
            let before = walk(&db);
            // 5 % of 2 GiB: the same ~100 MiB whatever the store's size.
            mutate(&db, keys + rep * 10_000, 2048, 7000 + rep);
            fresh.push(new_bytes(&before, &db) as f64);
            let (m, out) = backup("blobsnap backup (scaling, incremental)").await;
            let v: serde_json::Value = serde_json::from_str(&out).expect("backup json");
            marker = v["marker"].as_str().expect("marker").to_string();
            secs.push(m.secs);
            rss = rss.max(m.rss_kib);
        }
        let to = dir.join("restore");
        rm(&to);
        let mut c = ctx.blobsnap(&server.endpoint);
        c.args(["restore", &marker, "--job", "manual", "--job-id"])
            .arg(&tag)
            .args(["--task", "backup", "--store", "db", "--to"])
            .arg(&to);
        let (restore, _) = timed(c, "blobsnap restore (scaling)").await;
        let inc = median(secs);
        incremental.push((size_mib, inc));
        println!(
            "| {} | {} | {:.2} | {} | {:.1} | {:.2} | {} | {:.2} | {} |",
            dir_size(&db) >> 20,
            walk(&db).len(),
            full.secs,
            full.rss_kib / 1024,
            median(fresh) / 1048576.0,
            inc,
            rss / 1024,
            restore.secs,
            restore.rss_kib / 1024
        );
        delete_prefix(
            &server.store(&server.endpoint).await,
            format!("manual/{tag}/"),
        )
        .await;
        rm(&dir);
    }
    if let (Some((a, ta)), Some((b, tb))) = (incremental.first(), incremental.last()) {
        println!(
            "\n- incremental time ratio, {b} MiB vs {a} MiB store: {:.2}",
            tb / ta
        );
    }
}

fn main() {
    let size_mib: u64 = arg("--size-mib").map_or(2048, |v| v.parse().expect("--size-mib"));
    let reps: usize = arg("--reps").map_or(3, |v| v.parse().expect("--reps"));
    let servers: Vec<String> = arg("--servers")
        .unwrap_or_else(|| "garage:2,s3s:1,localstack:1".into())
        .split(',')
        .map(str::to_string)
        .collect();
    let work = PathBuf::from(arg("--work").unwrap_or_else(|| "/var/tmp/blobsnap-compare".into()));
    let bin = PathBuf::from(
        std::env::var("BLOBSNAP_BIN")
            .unwrap_or_else(|_| format!("{}/target/release/blobsnap", env!("CARGO_MANIFEST_DIR"))),
    );
    assert!(
        bin.exists(),
        "{} missing: build it (benches/compare.sh does)",
        bin.display()
    );
    std::fs::create_dir_all(&work).expect("work dir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let pristine = work.join("pristine");
        let t = Instant::now();
        let keys = generate(&pristine, size_mib);
        let size = dir_size(&pristine.join("db"));
        eprintln!(
            "store: {:.0} MiB in {} files ({} keys), ready in {:.1} s",
            size as f64 / 1048576.0,
            walk(&pristine.join("db")).len(),
            keys,
            t.elapsed().as_secs_f64()
        );
        println!(
            "## {} MiB RocksDB store, {} files; per server: 1 counted repetition (through the proxy) + the timed ones (median: the upper one of an even count)",
            size >> 20,
            walk(&pristine.join("db")).len()
        );
        for spec in &servers {
            let (name, reps) = match spec.split_once(':') {
                Some((n, r)) => (n.to_string(), r.parse().expect("--servers name:reps")),
                None => (spec.clone(), reps),
            };
            if reps == 0 {
                continue;
            }
            let server = server(&name, &work).await;
            server.create_bucket().await;
            println!("\n{reps} timed repetition(s) on {}.", server.name);
            eprintln!("== {} at {}", server.name, server.endpoint);
            let ctx = Ctx {
                server: &server,
                bin: bin.clone(),
                work: work.clone(),
                pristine: pristine.clone(),
                keys,
                size_mib,
            };
            let mut results = Results::new();
            let mut facts = BTreeMap::new();
            // Counted repetition through the proxy (not timed: the proxy costs CPU).
            let proxy = support::proxy::Proxy::start(
                server.upstream,
                support::proxy::FaultRates::default(),
                1,
            )
            .await;
            eprintln!("-- counted repetition (through the proxy)");
            let mut counted = Results::new();
            repetition(
                &ctx,
                0,
                &proxy.endpoint(),
                Some(&proxy),
                &mut counted,
            )
            .await;
            for (k, v) in counted {
                for mut m in v {
                    m.secs = 0.0;
                    m.rss_kib = 0;
                    results.entry(k.clone()).or_default().push(m);
                }
            }
            for rep in 0..reps {
                eprintln!("-- repetition {}", rep + 1);
                facts = repetition(
                    &ctx,
                    rep,
                    &server.endpoint,
                    None,
                    &mut results,
                )
                .await;
                limit_line(&server, &work.join("db"), &mut results).await;
            }
            report(&server, size, &results, &facts);
        }
        if let Some(sizes) = arg("--scaling") {
            let sizes: Vec<u64> = sizes
                .split(',')
                .map(|v| v.parse().expect("--scaling MiB,MiB"))
                .collect();
            let name = servers[0].split(':').next().unwrap_or("garage").to_string();
            let server = server(&name, &work).await;
            server.create_bucket().await;
            scaling(&server, &bin, &work, &sizes).await;
        }
        if std::env::args().any(|a| a == "--micro") {
            micro(&work, &pristine).await;
        }
    });
}
