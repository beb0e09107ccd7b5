//! The operator commands end to end: spawn the real binary against the local store, assert
//! on `--json` output and exit codes.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::support;

use blobsnap::backend::{StoreSpec, SystemClock, TaskBackupManager as _, TaskContext};
use blobsnap::blob::backup::{BackupSettings, BlobBackupManager};
use blobsnap::blobstore::local::LocalStore;
use blobsnap::blobstore::{BlobKey, BlobStore, PutBody, PutOptions};
use blobsnap::layout::JobScope;
use blobsnap::local::rocks::RocksStore;

fn write_keys(db: &RocksStore, from: u32, n: u32) {
    for i in from..from + n {
        db.db()
            .put(format!("key{i:08}"), vec![(i % 251) as u8; 300])
            .unwrap();
    }
}

/// Where the CLI runs against: its store flags and env, and the same store for the test.
struct Target {
    store: Arc<dyn BlobStore>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    _harness: Option<support::Harness>,
}

fn local_target(root: &Path) -> Target {
    let dir = root.join("store");
    Target {
        store: Arc::new(LocalStore::new(&dir).unwrap()),
        args: vec!["--local".into(), dir.display().to_string()],
        env: vec![],
        _harness: None,
    }
}

async fn s3s_target() -> Target {
    let prefix = format!("cli-{:08x}/", rand::random::<u32>());
    let p = prefix.clone();
    let h = support::s3s_with(move |c| c.prefix = p).await;
    let support::Kind::S3(s3) = &h.kind else {
        unreachable!()
    };
    let args = vec![
        "--bucket".into(),
        s3.config().bucket.clone(),
        "--s3-endpoint".into(),
        s3.config().endpoint.clone().unwrap(),
        "--s3-region".into(),
        "us-east-1".into(),
        "--s3-path-style".into(),
        "--s3-prefix".into(),
        prefix,
    ];
    let env = vec![
        ("AWS_ACCESS_KEY_ID".into(), support::S3S_ACCESS_KEY.into()),
        (
            "AWS_SECRET_ACCESS_KEY".into(),
            support::S3S_SECRET_KEY.into(),
        ),
        ("BLOBSNAP_S3_CREATE_ONLY".into(), "racy".into()),
        ("BLOBSNAP_S3_MULTIPART_LISTING".into(), "false".into()),
    ];
    Target {
        store: Arc::clone(&h.store),
        args,
        env,
        _harness: Some(h),
    }
}

async fn two_snapshots(t: &Target, root: &Path) -> (String, String) {
    let store: Arc<dyn BlobStore> = Arc::clone(&t.store);
    let task = TaskContext {
        job_name: "j".into(),
        job_id: "1".into(),
        task_name: "Partition 0".into(),
    };
    let spec = StoreSpec {
        name: "s".into(),
        dir: root.join("db"),
    };
    let mgr = BlobBackupManager::new(
        store,
        task,
        std::slice::from_ref(&spec),
        Arc::new(SystemClock),
        BackupSettings::default(),
    )
    .unwrap();
    mgr.init(None).await.unwrap();
    let db = RocksStore::open("s", &spec.dir).unwrap();
    let mut markers = Vec::new();
    for (i, id) in ["1000-0", "2000-0"].iter().enumerate() {
        write_keys(&db, i as u32 * 2000, 2000);
        let m = support::rocks::commit_once(&mgr, &db, id.parse().unwrap()).await;
        markers.push(m["s"].clone());
    }
    (markers[0].clone(), markers[1].clone())
}

/// A cache dir of the tests' own: the CLI's hash cache never lands in the user's
/// `~/.cache/blobsnap`.
fn cache_dir() -> &'static Path {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().unwrap()).path()
}

async fn run(t: &Target, args: &[&str]) -> (Option<i32>, serde_json::Value, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
        .arg("--json")
        .args(&t.args)
        .args(args)
        .env("XDG_CACHE_HOME", cache_dir())
        .envs(t.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .await
        .unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (
        out.status.code(),
        v,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `demo --dir DIR --partitions P --lines L` and `extra`: it must exit 0 (its counts checked
/// against the input, which a run exits 4 on); its JSON summary.
async fn demo_ok(
    t: &Target,
    dir: &str,
    partitions: &str,
    lines: &str,
    extra: &[&str],
) -> serde_json::Value {
    let mut a = vec![
        "demo",
        "--dir",
        dir,
        "--partitions",
        partitions,
        "--lines",
        lines,
    ];
    a.extend_from_slice(extra);
    let (code, v, err) = run(t, &a).await;
    assert_eq!(code, Some(0), "{a:?}: {err}");
    v
}

/// The demo with one task in `dir` under job id `id`, `lines` lines and a commit every 300,
/// plus `extra` arguments: it must exit 0 with its counts checked; its JSON summary.
async fn demo_one_task(
    t: &Target,
    dir: &str,
    id: &str,
    lines: &str,
    extra: &[&str],
) -> serde_json::Value {
    let a = [&["--commit-every", "300", "--job-id", id][..], extra].concat();
    let v = demo_ok(t, dir, "1", lines, &a).await;
    assert_eq!(v["check"], "ok", "{v}");
    v
}

const SNAP: [&str; 8] = [
    "--job",
    "j",
    "--job-id",
    "1",
    "--task",
    "Partition 0",
    "--store",
    "s",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_diff_verify_and_restore_local() {
    let tmp = tempfile::tempdir().unwrap();
    inspect_diff_verify_and_restore(&local_target(tmp.path()), tmp.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_diff_verify_and_restore_s3s() {
    let tmp = tempfile::tempdir().unwrap();
    inspect_diff_verify_and_restore(&s3s_target().await, tmp.path()).await;
}

async fn inspect_diff_verify_and_restore(t: &Target, root: &Path) {
    let (m1, m2) = two_snapshots(t, root).await;

    let (code, v, err) = run(t, &[&["inspect"][..], &SNAP, &[m2.as_str()]].concat()).await;
    assert_eq!(code, Some(0), "{err}");
    let files = v["files"].as_array().unwrap();
    assert_eq!(v["total-files"].as_u64().unwrap() as usize, files.len());
    assert!(files
        .iter()
        .any(|f| f["path"].as_str().unwrap().ends_with(".sst")));
    assert!(
        v["uploaded-files"].as_u64().unwrap() < files.len() as u64,
        "the second snapshot reuses blobs: {v}"
    );

    let (code, v, err) = run(
        t,
        &[&["diff"][..], &SNAP, &[m1.as_str(), m2.as_str()]].concat(),
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert!(v["added"]["files"].as_u64().unwrap() >= 1, "a new SST: {v}");
    assert!(
        v["retained"]["files"].as_u64().unwrap() >= 1,
        "the first SST: {v}"
    );

    let (code, v, err) = run(
        t,
        &[&["verify", "--deep"][..], &SNAP, &[m2.as_str()]].concat(),
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert!(v["problems"].as_array().unwrap().is_empty());
    assert!(v["objects"].as_u64().is_some_and(|n| n > 0), "{v}");
    assert_eq!(v["deep-checked"], v["objects"], "{v}");

    // Restore with the plan first, then for real.
    let to = root.join("restored");
    let (code, v, err) = run(
        t,
        &[
            "restore",
            &m2,
            "--job",
            "j",
            "--task",
            "Partition 0",
            "--store",
            "s",
            "--to",
            to.to_str().unwrap(),
            "--dry-run",
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["dry-run"], true);
    assert!(!to.exists(), "a dry run writes nothing");
    let dry = v;
    let (code, v, err) = run(
        t,
        &[
            "restore",
            &m2,
            "--job",
            "j",
            "--task",
            "Partition 0",
            "--store",
            "s",
            "--to",
            to.to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert!(v["bytes-fetched"].as_u64().unwrap() > 0);
    // The dry run printed the plan the real run carried out, file by file.
    assert_eq!(v["dry-run"], false);
    assert_eq!(
        (&dry["schema"], &v["schema"]),
        (&2.into(), &2.into()),
        "{v}"
    );
    assert_eq!(dry["files"], v["files"], "{dry}\n{v}");
    assert_eq!(dry["plan"], v["plan"], "{dry}\n{v}");
    let planned = v["files"].as_array().unwrap();
    assert!(planned.iter().any(|f| f["action"] == "download"), "{v}");
    assert_eq!(
        v["bytes-fetched"].as_u64(),
        Some(
            planned
                .iter()
                .filter(|f| f["action"] == "download" || f["action"] == "inline")
                .map(|f| f["size"].as_u64().unwrap())
                .sum()
        ),
        "what was fetched is what the plan's downloads and inline files add up to: {v}"
    );
    let db = RocksStore::open("check", &to).unwrap();
    assert_eq!(db.db().iterator(rocksdb::IteratorMode::Start).count(), 4000);

    // A corrupted blob (same size): HEAD passes, --deep fails with exit code 4.
    let store = Arc::clone(&t.store);
    let sst = files
        .iter()
        .find(|f| f["path"].as_str().unwrap().ends_with(".sst"))
        .unwrap();
    let scope = JobScope::new("j", "1")
        .unwrap()
        .store("Partition 0", "s")
        .unwrap();
    let key = scope.key(sst["blob"].as_str().unwrap()).unwrap();
    let size = sst["size"].as_u64().unwrap() as usize;
    store
        .put(
            &key,
            PutBody::Bytes(vec![7u8; size].into()),
            PutOptions::default(),
        )
        .await
        .unwrap();
    let (code, _, _) = run(t, &[&["verify"][..], &SNAP, &[m2.as_str()]].concat()).await;
    assert_eq!(code, Some(0), "same size: a HEAD cannot tell");
    let (code, v, _) = run(
        t,
        &[&["verify", "--deep"][..], &SNAP, &[m2.as_str()]].concat(),
    )
    .await;
    assert_eq!(code, Some(4), "{v}");
    assert_eq!(v["problems"][0]["kind"], "corrupt");
    // A deleted blob: exit code 3.
    store.delete_many(std::slice::from_ref(&key)).await.unwrap();
    let (code, v, _) = run(t, &[&["verify"][..], &SNAP, &[m2.as_str()]].concat()).await;
    assert_eq!(code, Some(3), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_input_gives_a_clear_error_and_exit_code() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.json");
    std::fs::write(&bad, br#"{"checkpoint-id": 12, "input-offsets": {}}"#).unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
        .args(["checkpoint", "show"])
        .arg(&bad)
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&out.stderr).contains("must be a string"));
    std::fs::write(&bad, br#"{"checkpoint-id":"1234-567","input-offsets":{"test-system.test-stream.777":"1"},"state-checkpoint-markers":{},"version":2}"#).unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
        .args(["checkpoint", "show"])
        .arg(&bad)
        .output()
        .await
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"checkpoint-id\":\"1234-567\""));
    // A malformed marker is invalid input (5).
    let (code, _, err) = run(
        &local_target(tmp.path()),
        &[&["inspect"][..], &SNAP, &["index/../x.json"]].concat(),
    )
    .await;
    assert_eq!(code, Some(5), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_restore_ls_local() {
    let tmp = tempfile::tempdir().unwrap();
    backup_a_closed_db_dedup_restore_ls_and_a_locked_db_is_refused(
        &local_target(tmp.path()),
        tmp.path(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_restore_ls_s3s() {
    let tmp = tempfile::tempdir().unwrap();
    backup_a_closed_db_dedup_restore_ls_and_a_locked_db_is_refused(&s3s_target().await, tmp.path())
        .await;
}

async fn backup_a_closed_db_dedup_restore_ls_and_a_locked_db_is_refused(t: &Target, root: &Path) {
    let dbdir = root.join("mydb");
    {
        let db = RocksStore::open("x", &dbdir).unwrap();
        write_keys(&db, 0, 3000);
    }
    let before = support::files_but_logs(&dbdir);
    assert!(
        before.keys().any(|n| n.ends_with(".log")),
        "the closed DB has a WAL to carry: {:?}",
        before.keys()
    );
    let (code, v1, err) = run(
        t,
        &[
            "backup",
            "--db",
            dbdir.to_str().unwrap(),
            "--name",
            "nightly 1",
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        support::files_but_logs(&dbdir),
        before,
        "a backup never changes the database it backs up"
    );
    {
        let db = RocksStore::open("x", &dbdir).unwrap();
        write_keys(&db, 3000, 1000);
    }
    let before = support::files_but_logs(&dbdir);
    let (code, v2, err) = run(
        t,
        &[
            "backup",
            "--db",
            dbdir.to_str().unwrap(),
            "--name",
            "nightly 1",
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(support::files_but_logs(&dbdir), before);
    assert!(
        v2["uploaded-bytes"].as_u64().unwrap() < v2["bytes"].as_u64().unwrap(),
        "the second backup reuses: {v2}"
    );
    // `restore MARKER ... --to DIR [FLAG]` of this backup name, run; (exit code, stderr).
    let restore = |marker: String, dir: &Path, flag: Option<&str>| {
        let mut args = vec![
            "restore".to_string(),
            marker,
            "--job".into(),
            "manual".into(),
            "--job-id".into(),
            "nightly 1".into(),
            "--task".into(),
            "backup".into(),
            "--store".into(),
            "db".into(),
            "--to".into(),
            dir.to_str().unwrap().into(),
        ];
        args.extend(flag.map(String::from));
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let (code, _, err) = run(t, &args).await;
            (code, err)
        }
    };
    let marker = v2["marker"].as_str().unwrap().to_string();
    // Restore the second backup and read it.
    let to = root.join("back");
    let (code, err) = restore(marker.clone(), &to, None).await;
    assert_eq!(code, Some(0), "{err}");
    // Again into the same dir: every file is reused, none downloaded, and each reused byte is
    // hashed once — the plan printed is the plan carried out, not planned (and hashed) again.
    let to_s = to.to_str().unwrap().to_string();
    // (By the backup's name, as `backup` says: its latest backup, the one just restored.)
    let again = ["restore", "--name", "nightly 1", "--to", &to_s];
    let (code, v, err) = run(t, &again).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        v["marker"], marker,
        "--name restores the name's latest backup: {v}"
    );
    let (code, _, err) = run(t, &["inspect", "--name", "nightly 1", "--job", "manual"]).await;
    assert_eq!(
        code,
        Some(2),
        "--name and --job together are a usage error: {err}"
    );
    let (code, _, err) = run(t, &["inspect", "--job", "manual"]).await;
    assert_eq!(
        code,
        Some(2),
        "--task and --store are required without --name: {err}"
    );
    assert_eq!(v["bytes-fetched"], 0, "{v}");
    assert_eq!(v["plan"]["files-to-download"], 0, "{v}");
    let reused = v["plan"]["bytes-reused"].as_u64().unwrap();
    assert!(reused > 0, "{v}");
    // Mutable files (MANIFEST, OPTIONS, CURRENT, WAL) are copied, not linked, and the copy is
    // verified: that is their second read, by design.
    let copied: u64 = std::fs::read_dir(&to)
        .unwrap()
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n != "RESTORED" && !n.ends_with(".sst") && !n.ends_with(".blob")
        })
        .map(|e| e.metadata().unwrap().len())
        .sum();
    // The SSTs were recorded in the hash cache by the restore that wrote them: proved by it,
    // not read. Every other reused byte is read once to plan, and each copied one once more.
    let ssts: u64 = std::fs::read_dir(&to)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".sst"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert!(ssts > 0);
    assert!(
        v["plan"]["files-proved-by-cache"].as_u64().unwrap() >= 1,
        "{v}"
    );
    assert_eq!(
        v["plan"]["bytes-hashed"].as_u64().unwrap(),
        reused - ssts,
        "{v}"
    );
    assert_eq!(
        v["bytes-hashed"].as_u64().unwrap(),
        reused - ssts + copied,
        "each reused byte not proved by the cache hashed once to plan (and each copied one once more, to verify the copy): {v}"
    );
    // A non-empty directory blobsnap did not restore is somebody's data: refused (exit 5),
    // untouched, even with --force (it is no store); --replace-any-dir replaces it.
    let foreign = root.join("foreign");
    std::fs::create_dir_all(&foreign).unwrap();
    std::fs::write(foreign.join("precious.txt"), b"mine").unwrap();
    for flag in [None, Some("--force")] {
        let (code, err) = restore(marker.clone(), &foreign, flag).await;
        assert_eq!(code, Some(5), "{flag:?}: {err}");
        assert!(err.contains("--replace-any-dir"), "{err}");
        assert_eq!(
            std::fs::read(foreign.join("precious.txt")).unwrap(),
            b"mine"
        );
    }
    let (code, err) = restore(marker.clone(), &foreign, Some("--replace-any-dir")).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(!foreign.join("precious.txt").exists());
    // A RocksDB store blobsnap did not restore (a copy of the database): refused without
    // --force, replaced with it.
    let copy = root.join("copy");
    std::fs::create_dir_all(&copy).unwrap();
    for (name, bytes) in support::files_but_logs(&dbdir) {
        std::fs::write(copy.join(name), bytes).unwrap();
    }
    let (code, err) = restore(marker.clone(), &copy, None).await;
    assert_eq!(code, Some(5), "{err}");
    assert!(err.contains("--force"), "{err}");
    let (code, err) = restore(marker.clone(), &copy, Some("--force")).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(copy.join("RESTORED").is_file());
    // The restore holds the bytes the database had (its live files; no LOCK, no LOG).
    let restored = support::files_but_logs(&to);
    let mut expected = before.clone();
    let current = String::from_utf8(before["CURRENT"].clone()).unwrap();
    expected.retain(|n, _| n != "LOCK" && (!n.starts_with("MANIFEST-") || *n == current.trim()));
    let restored_names: Vec<_> = restored.keys().filter(|n| *n != "RESTORED").collect();
    assert_eq!(restored_names, expected.keys().collect::<Vec<_>>());
    for (n, bytes) in &expected {
        assert!(restored[n] == *bytes, "{n} differs after the restore");
    }
    let db = RocksStore::open("check", &to).unwrap();
    assert_eq!(db.db().iterator(rocksdb::IteratorMode::Start).count(), 4000);
    // A restore into a dir whose database is open (here, in this process) is refused with
    // exit code 6 and touches nothing.
    let held = support::files_but_logs(&to);
    let (code, err) = restore(v1["marker"].as_str().unwrap().to_string(), &to, None).await;
    assert_eq!(code, Some(6), "{err}");
    assert!(err.contains("open in another process"), "{err}");
    assert_eq!(
        support::files_but_logs(&to),
        held,
        "the refused restore touched the dir"
    );
    drop(db);
    // ls shows the manual scope with both snapshots; the sweep keeps both (they are pinned).
    let (code, ls, err) = run(t, &["ls"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        ls["jobs"]["manual/nightly 1"]["backup"]["stores"]["db"]["snapshots"], 2,
        "{ls}"
    );
    assert_eq!(
        ls["jobs"]["manual/nightly 1"]["backup"]["stores"]["db"]["newest"], v2["marker"],
        "the newest snapshot is the second backup's: {ls}"
    );
    let (code, gc, err) = run(
        t,
        &[
            "gc",
            "--job",
            "manual",
            "--job-id",
            "nightly 1",
            "--grace-secs",
            "0",
            "--force",
            "--dry-run",
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert!(gc["plan"]["delete"].as_array().unwrap().is_empty(), "{gc}");
    let _ = v1;
    // A database held open by a running process is refused with exit code 6.
    let _held = RocksStore::open("x", &dbdir).unwrap();
    let (code, _, err) = run(
        t,
        &[
            "backup",
            "--db",
            dbdir.to_str().unwrap(),
            "--name",
            "nightly 1",
        ],
    )
    .await;
    assert_eq!(code, Some(6), "{err}");
    assert!(err.contains("locked"), "{err}");
}

/// A demo with `--metrics-addr 127.0.0.1:0` (a free port, printed), held at its `n`-th
/// checkpoint write (`BLOBSNAP_HOLD_AT`: alive by construction, whatever the machine's speed).
/// Returns the process, the address and the file whose creation releases it.
async fn held_demo_with_metrics(
    dir: &Path,
    nth: u32,
    lines: u32,
    envs: &[(&str, &str)],
) -> (tokio::process::Child, String, PathBuf) {
    use tokio::io::AsyncBufReadExt as _;
    let go = dir.join(format!("go-{nth}"));
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
        .env("XDG_CACHE_HOME", cache_dir())
        .env("BLOBSNAP_HOLD_AT", format!("commit.after-checkpoint@{nth}"))
        .env("BLOBSNAP_HOLD_UNTIL", &go)
        .envs(envs.iter().copied())
        .kill_on_drop(true)
        .args(["demo", "--dir"])
        .arg(dir.join("demo"))
        .args([
            "--partitions",
            "2",
            "--lines",
            &lines.to_string(),
            "--commit-every",
            "300",
            "--metrics-addr",
            "127.0.0.1:0",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut addr = None;
    loop {
        let line = lines
            .next_line()
            .await
            .unwrap()
            .expect("the demo prints its metrics address and reaches the hold point");
        if let Some(rest) = line.strip_prefix("demo: Prometheus metrics on http://") {
            addr = Some(rest.trim_end_matches("/metrics").to_string());
        }
        if line.contains("hold point commit.after-checkpoint reached") {
            break;
        }
    }
    let addr = addr.expect("the address came before the first commit");
    // Drain the rest of stderr so the demo never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, addr, go)
}

async fn http_get(addr: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut got = String::new();
    s.read_to_string(&mut got).await.unwrap();
    got
}

/// Whether `scraped` has a series of `name` and its `# HELP` and `# TYPE` lines.
fn has_metric(scraped: &str, m: &blobsnap::telemetry::Metric) -> bool {
    let kind = match m.kind {
        blobsnap::telemetry::Kind::Counter => "counter",
        blobsnap::telemetry::Kind::Gauge => "gauge",
        // The exporter renders histograms as summaries unless given buckets.
        blobsnap::telemetry::Kind::Histogram => "summary",
    };
    scraped.contains(&format!("# HELP {} {}", m.name, m.help))
        && scraped.contains(&format!("# TYPE {} {kind}", m.name))
        && scraped
            .lines()
            .any(|l| l.starts_with(m.name) && !l.starts_with('#'))
}

/// Scrape the demo's Prometheus endpoint while it runs: every metric of the library's catalog
/// (the table of docs/metrics.md) is served with its `# HELP` and `# TYPE` lines. Held at its
/// third checkpoint write (of three, two are one task's, so that task's first commit has
/// ended and counted), a first run shows every counter (started at 0) and every gauge and
/// histogram of commits, uploads and transfers; the same demo started again on a new host (its
/// state dir gone, a budget of one transfer) shows the restore's and the wait for a transfer
/// slot. One gauge no demo can show is named in the test: a warm standby's applied number.
/// Another path is a 404; released, each run ends well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_serves_every_metric_of_the_catalog() {
    use blobsnap::telemetry::{Kind, METRICS};
    let tmp = tempfile::tempdir().unwrap();
    // Set only by a warm standby: no demo run shows it. The wait for a transfer slot shows in
    // the second run, whose budget of one transfer makes the restore's downloads queue.
    let not_here = [
        "blobsnap_standby_applied_seq",
        "blobsnap_limit_wait_seconds",
    ];
    // With pre-upload (off by default), whose metrics are in the catalog.
    let (mut child, addr, go) =
        held_demo_with_metrics(tmp.path(), 3, 6000, &[("BLOBSNAP_PRE_UPLOAD", "true")]).await;
    let scraped = http_get(&addr, "/metrics").await;
    assert!(scraped.starts_with("HTTP/1.1 200"), "{scraped}");
    for m in METRICS {
        let later = not_here.contains(&m.name) || m.name.starts_with("blobsnap_restore_");
        if m.kind == Kind::Counter || !later {
            assert!(
                has_metric(&scraped, m),
                "{} (with its HELP and TYPE) missing from:\n{scraped}",
                m.name
            );
        }
    }
    assert!(
        scraped.contains("blobsnap_commits_total{task=\"Partition 0\"}")
            && scraped.contains(
                "blobsnap_backup_bytes_uploaded_total{task=\"Partition 0\",store=\"counts\"}"
            ),
        "per-task and per-store series: {scraped}"
    );
    let other = http_get(&addr, "/other").await;
    assert!(other.starts_with("HTTP/1.1 404"), "{other}");
    std::fs::write(&go, b"go").unwrap();
    let status = wait_within(&mut child).await;
    assert!(status.success(), "{status:?}");

    // A new host: the same job, its state dir gone, restores from the store first, then goes
    // on through input that grew (the same lines, and as many again).
    std::fs::remove_dir_all(tmp.path().join("demo/state")).unwrap();
    let (mut child, addr, go) =
        held_demo_with_metrics(tmp.path(), 1, 12000, &[("BLOBSNAP_MAX_TRANSFERS", "1")]).await;
    let scraped = http_get(&addr, "/metrics").await;
    for m in METRICS.iter().filter(|m| {
        m.name.starts_with("blobsnap_restore_")
            || m.name == "blobsnap_task_first_message_seconds"
            || m.name == "blobsnap_limit_wait_seconds"
    }) {
        assert!(
            has_metric(&scraped, m),
            "{} missing after a restore:\n{scraped}",
            m.name
        );
    }
    let downloaded = scraped
        .lines()
        .filter(|l| l.starts_with("blobsnap_restore_bytes_downloaded_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>();
    assert!(
        downloaded > 0.0,
        "the new host downloaded its state: {scraped}"
    );
    std::fs::write(&go, b"go").unwrap();
    let status = wait_within(&mut child).await;
    assert!(status.success(), "{status:?}");
}

/// `blobsnap probe` finds s3s-fs's create-only check racy (more than one of 16 concurrent
/// writers wins, a sequential second put is refused); with `create-only = "auto"` (no
/// `BLOBSNAP_S3_CREATE_ONLY`) the demo then refuses to start, says why, and runs when told
/// `--unsafe-no-fencing`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_and_the_demo_refused_where_there_is_no_fence() {
    let mut t = s3s_target().await;
    t.env.retain(|(k, _)| k != "BLOBSNAP_S3_CREATE_ONLY");
    let (code, v, err) = run(&t, &["probe"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["schema"], 1);
    let verdict = v["probe"]["create-only"]["verdict"].as_str().unwrap();
    assert_ne!(verdict, "atomic", "{v}");
    assert_eq!(v["probe"]["create-only"]["sequential-refused"], true, "{v}");
    assert_eq!(v["probe"]["verifies-sha256"], false, "{v}");

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo").display().to_string();
    let demo = ["demo", "--dir", &dir, "--partitions", "1", "--lines", "500"];
    let (code, _, err) = run(&t, &demo).await;
    assert_eq!(code, Some(8), "refused as permanent: {err}");
    assert!(
        err.contains("does not enforce create-only writes") && err.contains("unsafe_no_fencing"),
        "{err}"
    );
    let mut told = demo.to_vec();
    told.push("--unsafe-no-fencing");
    let (code, v, err) = run(&t, &told).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["check"], "ok", "{v}");

    // The local store's capabilities are fixed: probing it is a usage error.
    let (code, _, err) = run(&local_target(tmp.path()), &["probe"]).await;
    assert_eq!(code, Some(5), "{err}");
}

/// The scope's guards, from the CLI and the runtime (DESIGN §10): `admin create`/`validate`;
/// the job validates before its first commit (another deployment's scope → exit 6, nothing
/// committed) and records its sweep grace; `gc` refuses a shorter grace unless `--force`, and
/// even forced while a task of the job runs (its writer lease); a killed task's lease is
/// cleared by the task's next claim, and a task that stops deletes its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scope_is_guarded_by_admin_validation_and_writer_leases() {
    use blobsnap::blob::admin::read_scope_record;
    use blobsnap::checkpoint::{BlobCheckpointStore, CheckpointStore as _};
    let tmp = tempfile::tempdir().unwrap();
    let t = local_target(tmp.path());
    let job = JobScope::new("wordcount", "1").unwrap();
    let leases = |t: &Target| {
        let store = Arc::clone(&t.store);
        let scope = job.all_writers().unwrap();
        async move {
            blobsnap::blobstore::list_all(store.as_ref(), &scope)
                .await
                .unwrap()
                .len()
        }
    };

    let (code, v, err) = run(
        &t,
        &[
            "admin",
            "create",
            "--job",
            "wordcount",
            "--gc-grace-secs",
            "7200",
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["result"], "created and valid", "{v}");
    let (code, _, err) = run(&t, &["admin", "validate", "--job", "wordcount"]).await;
    assert_eq!(code, Some(0), "{err}");
    // A typo'd job: not found, and the message names the command that creates it (not a
    // library function).
    let (code, _, err) = run(&t, &["admin", "validate", "--job", "wordcnt"]).await;
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains("blobsnap admin create") && !err.contains("create_resources"),
        "{err}"
    );
    let (code, _, err) = run(
        &t,
        &[
            "admin",
            "validate",
            "--job",
            "wordcount",
            "--deployment",
            "other",
        ],
    )
    .await;
    assert_eq!(code, Some(6), "another deployment's scope: {err}");
    assert!(err.contains("belongs to deployment \"default\""), "{err}");

    // The runtime validates before it claims or commits anything.
    let dir = tmp.path().join("demo");
    let cfg = tmp.path().join("other.toml");
    std::fs::write(&cfg, "[job]\ndeployment-id = \"other\"\n").unwrap();
    let demo = |extra: &[&str]| {
        let mut a = vec![
            "demo".to_string(),
            "--dir".into(),
            dir.display().to_string(),
            "--partitions".into(),
            "1".into(),
            "--gc-grace-secs".into(),
            "3600".into(),
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let mut other = t.args.clone();
    other.extend(["--config".into(), cfg.display().to_string()]);
    let other_t = Target {
        store: Arc::clone(&t.store),
        args: other,
        env: vec![],
        _harness: None,
    };
    let args = demo(&["--lines", "300"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, err) = run(&other_t, &args).await;
    assert_eq!(code, Some(6), "{err}");
    assert!(
        err.contains("validate") || err.contains("belongs to"),
        "{err}"
    );
    let cps = BlobCheckpointStore::new(Arc::clone(&t.store), job.clone());
    assert!(
        cps.history("Partition 0", 1).await.unwrap().is_empty(),
        "nothing committed by a refused deployment"
    );

    // The job runs, records its grace, and leaves no lease behind.
    let (code, v, err) = run(&t, &args).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["check"], "ok");
    let rec = read_scope_record(t.store.as_ref(), &job)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.gc_grace_secs, Some(3600), "{rec:?}");
    assert_eq!(leases(&t).await, 0, "a stopped task deletes its lease");

    let gc = |grace: &str, force: bool| {
        let mut a = vec!["gc", "--job", "wordcount", "--grace-secs"];
        a.push(if grace == "0" { "0" } else { "3600" });
        if force {
            a.push("--force");
        }
        a.into_iter().map(str::to_string).collect::<Vec<_>>()
    };
    let gc_run = |grace: &'static str, force: bool| {
        let a = gc(grace, force);
        let t = &t;
        async move {
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            run(t, &a).await
        }
    };
    let (code, _, err) = gc_run("0", false).await;
    assert_eq!(code, Some(5), "a grace under the job's: {err}");
    assert!(err.contains("3600 s") && err.contains("--force"), "{err}");
    // A dry run prints its plan, and exits as the real run would: refused.
    let (code, v, err) = run(
        &t,
        &["gc", "--job", "wordcount", "--grace-secs", "0", "--dry-run"],
    )
    .await;
    assert_eq!(code, Some(5), "{err}");
    assert!(
        v["refused"].as_str().is_some_and(|r| r.contains("--force")),
        "{v}"
    );
    assert!(err.contains("a real run would be refused"), "{err}");
    let (code, _, err) = gc_run("3600", false).await;
    assert_eq!(code, Some(0), "{err}");
    let (code, _, err) = gc_run("0", true).await;
    assert_eq!(code, Some(0), "forced, with the job stopped: {err}");

    // A running task holds a lease: a forced short sweep is refused while it runs.
    let mut args = t.args.clone();
    args.push("--json".into());
    args.extend(demo(&["--lines", "200000", "--commit-every", "2000"]));
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
        .env("XDG_CACHE_HOME", cache_dir())
        .args(&args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // The first process's resumed run commits on top of the earlier history: wait for a
    // new checkpoint.
    let before = cps.history("Partition 0", usize::MAX).await.unwrap()[0].seq;
    let started = std::time::Instant::now();
    while cps.history("Partition 0", 1).await.unwrap()[0].seq <= before + 1 {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(120),
            "no commit seen"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the demo ended too soon"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(leases(&t).await, 1, "the running task's lease");
    let (code, _, err) = gc_run("0", true).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "the demo was still running"
    );
    assert_eq!(
        code,
        Some(6),
        "a forced short sweep beside a running task: {err}"
    );
    assert!(
        err.contains("Partition 0") && err.contains("lease"),
        "{err}"
    );
    // Killed, its lease stays (it may have died mid-commit). A lease of a process on another
    // host is honoured until its grace ends; this one's process is known to be gone (this
    // machine, this boot, this pid namespace, no process with its pid and start time): the
    // sweep says so and proceeds. The same lease copied as another host's still refuses.
    child.kill().await.unwrap();
    child.wait().await.unwrap();
    assert_eq!(leases(&t).await, 1, "the killed task's lease stays");
    let job = JobScope::new("wordcount", "1").unwrap();
    let lease_key = blobsnap::blobstore::list_all(t.store.as_ref(), &job.all_writers().unwrap())
        .await
        .unwrap()[0]
        .key
        .clone();
    let lease_bytes = blobsnap::blobstore::get_bytes(t.store.as_ref(), &lease_key, 1 << 20)
        .await
        .unwrap();
    let mut other: serde_json::Value = serde_json::from_slice(&lease_bytes).unwrap();
    other["host"] = format!("{}-elsewhere", other["host"].as_str().unwrap()).into();
    let other_key = job
        .writers("Partition 1")
        .unwrap()
        .key("elsewhere.json")
        .unwrap();
    t.store
        .put(
            &other_key,
            PutBody::Bytes(serde_json::to_vec(&other).unwrap().into()),
            PutOptions::default(),
        )
        .await
        .unwrap();
    let (code, _, err) = gc_run("0", true).await;
    assert_eq!(
        code,
        Some(6),
        "another host's lease, within its grace: {err}"
    );
    assert!(err.contains("-elsewhere"), "{err}");
    t.store
        .delete_many(std::slice::from_ref(&other_key))
        .await
        .unwrap();
    let (code, _, err) = gc_run("0", true).await;
    assert_eq!(code, Some(0), "a dead process's lease on this host: {err}");
    assert!(
        err.contains("no longer runs"),
        "says why it proceeds: {err}"
    );
    // The task's next claim fences the dead writer off and drops its lease, and deletes its
    // own when it stops.
    let args = demo(&["--lines", "200000", "--commit-every", "2000"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, v, err) = run(&t, &args).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["check"], "ok");
    assert_eq!(leases(&t).await, 0);
    let (code, _, err) = gc_run("0", true).await;
    assert_eq!(code, Some(0), "{err}");
}

/// A crash point name that does not exist is refused (exit 5, naming it), never taken for a
/// point that is merely not reached; a bad hit number too.
#[tokio::test]
async fn an_unknown_crash_point_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    for (at, needle) in [
        ("commit.befor-upload", "is not a crash point"),
        ("commit.before-upload@0", "positive integer"),
        ("commit.before-upload@x", "positive integer"),
    ] {
        let mut t = local_target(tmp.path());
        t.env.push(("BLOBSNAP_CRASH_AT".into(), at.into()));
        let (code, _, err) = run(&t, &["ls"]).await;
        assert_eq!(code, Some(5), "{at}: {err}");
        assert!(err.contains(needle) && err.contains(at), "{at}: {err}");
    }
    let mut t = local_target(tmp.path());
    t.env
        .push(("BLOBSNAP_CRASH_AT".into(), "commit.before-upload@2".into()));
    let (code, _, err) = run(&t, &["ls"]).await;
    assert_eq!(code, Some(0), "a known point: {err}");
}

/// The commands that take a marker default to the store's marker in the task's latest
/// committed checkpoint (inspect, verify, restore); `index show` normalizes a real index the
/// demo wrote (from a file and from stdin); `verify --deep --sample` downloads exactly the
/// share asked for (rounded up) and refuses a share outside (0, 100] or without --deep; `gc
/// --task/--store` deletes the orphans of that task and store only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latest_by_default_index_show_sample_and_scoped_gc() {
    use blobsnap::checkpoint::{BlobCheckpointStore, CheckpointStore as _};
    let tmp = tempfile::tempdir().unwrap();
    let t = local_target(tmp.path());
    let dir = tmp.path().join("demo");
    demo_ok(
        &t,
        dir.to_str().unwrap(),
        "2",
        "3000",
        &["--commit-every", "500", "--stores", "counts,lengths"],
    )
    .await;
    let cps = BlobCheckpointStore::new(
        Arc::clone(&t.store),
        JobScope::new("wordcount", "1").unwrap(),
    );
    let latest = cps.latest("Partition 0").await.unwrap().unwrap();
    let v2 = latest.checkpoint.as_v2().unwrap().clone();
    let marker = v2.state_checkpoint_markers[blobsnap::blob::FACTORY_NAME]["counts"].clone();
    let snap = [
        "--job",
        "wordcount",
        "--task",
        "Partition 0",
        "--store",
        "counts",
    ];

    // inspect without a marker: the latest checkpoint's, with its offsets.
    let (code, v, err) = run(&t, &[&["inspect"][..], &snap].concat()).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["marker"].as_str(), Some(marker.as_str()), "{v}");
    assert_eq!(v["checkpoint"]["seq"].as_u64(), Some(latest.seq), "{v}");
    assert_eq!(
        v["checkpoint"]["document"]["checkpoint-id"].as_str(),
        Some(v2.id.to_string().as_str()),
        "{v}"
    );
    let files = v["files"].as_array().unwrap().len();
    // verify without a marker checks that one.
    let (code, v, err) = run(&t, &[&["verify"][..], &snap].concat()).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["marker"].as_str(), Some(marker.as_str()), "{v}");
    assert!(v["objects"].as_u64() >= Some(1), "{v}");
    // restore without a marker restores that checkpoint.
    let to = tmp.path().join("restored");
    let (code, _, err) = run(
        &t,
        &[&["restore"][..], &snap, &["--to", to.to_str().unwrap()]].concat(),
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    let restored: serde_json::Value =
        serde_json::from_slice(&std::fs::read(to.join(blobsnap::index::RESTORED_MARKER)).unwrap())
            .unwrap();
    assert_eq!(
        restored["index"].as_str(),
        Some(marker.as_str()),
        "{restored}"
    );

    // verify --deep --sample: exactly ceil(objects × pct / 100) downloaded, on a manual backup
    // of three flushed SSTs (the demo's SST count follows its skipped commits: timing).
    let sampled = tmp.path().join("sampled");
    {
        use blobsnap::backend::StoreEngine as _;
        let db = RocksStore::open("x", &sampled).unwrap();
        for part in 0..3 {
            write_keys(&db, part * 500, 500);
            db.flush().unwrap();
        }
    }
    let (code, _, err) = run(
        &t,
        &[
            "backup",
            "--db",
            sampled.to_str().unwrap(),
            "--name",
            "sampled",
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    for (pct, want) in [(1.0, 1), (50.0, 2), (100.0, 3)] {
        let (code, v, err) = run(
            &t,
            &[
                "verify",
                "--deep",
                "--sample",
                &pct.to_string(),
                "--name",
                "sampled",
            ],
        )
        .await;
        assert_eq!(code, Some(0), "{err}");
        assert_eq!(v["objects"].as_u64(), Some(3), "three SSTs: {v}");
        assert_eq!(
            v["deep-checked"].as_u64(),
            Some(want),
            "--sample {pct}: {v}"
        );
    }
    for bad in [
        &["--deep", "--sample", "0"][..],
        &["--deep", "--sample", "101"],
        &["--sample", "10"],
    ] {
        let (code, _, err) = run(&t, &[&["verify"][..], bad, &snap].concat()).await;
        assert_eq!(code, Some(5), "{bad:?}: {err}");
        assert!(err.contains("--sample"), "{bad:?}: {err}");
    }

    // index show: the real index, from a file and from stdin, normalized and the same.
    let key = JobScope::new("wordcount", "1")
        .unwrap()
        .store("Partition 0", "counts")
        .unwrap()
        .key(&marker)
        .unwrap();
    let bytes = blobsnap::blobstore::get_bytes(t.store.as_ref(), &key, 1 << 20)
        .await
        .unwrap();
    let file = tmp.path().join("index.json");
    std::fs::write(&file, &bytes).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
        .args(["index", "show"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let original: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        shown["dir-index"]["files-present"].as_array().map(Vec::len),
        Some(files),
        "{shown}"
    );
    assert_eq!(shown["checkpoint-id"], original["checkpoint-id"]);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
        .args(["index", "show", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write as _;
        child.stdin.take().unwrap().write_all(&bytes).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap(),
        shown
    );

    // gc --task/--store: an orphan blob in each of three stores; a scoped sweep deletes the
    // one of its task and store only.
    let orphan = |task: &str, store: &str| {
        JobScope::new("wordcount", "1")
            .unwrap()
            .store(task, store)
            .unwrap()
            .key(&format!("blobs/1000-0/{}", "ab".repeat(32)))
            .unwrap()
    };
    let orphans = [
        orphan("Partition 0", "counts"),
        orphan("Partition 0", "lengths"),
        orphan("Partition 1", "counts"),
    ];
    for k in &orphans {
        t.store
            .put(
                k,
                PutBody::Bytes(b"orphan".to_vec().into()),
                PutOptions::default(),
            )
            .await
            .unwrap();
    }
    let exists = |k: BlobKey| {
        let store = Arc::clone(&t.store);
        async move { store.head(&k).await.is_ok() }
    };
    let gc = ["gc", "--job", "wordcount", "--grace-secs", "0", "--force"];
    let (code, v, err) = run(
        &t,
        &[&gc[..], &["--task", "Partition 0", "--store", "counts"]].concat(),
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["deleted"].as_u64(), Some(1), "{v}");
    assert!(!exists(orphans[0].clone()).await);
    assert!(
        exists(orphans[1].clone()).await,
        "another store of the task is not swept"
    );
    assert!(
        exists(orphans[2].clone()).await,
        "another task is not swept"
    );
    let (code, v, err) = run(&t, &[&gc[..], &["--store", "counts"]].concat()).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["deleted"].as_u64(), Some(1), "{v}");
    assert!(!exists(orphans[2].clone()).await);
    assert!(
        exists(orphans[1].clone()).await,
        "--store counts keeps lengths"
    );
    let (code, v, err) = run(&t, &[&gc[..], &["--task", "Partition 0"]].concat()).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["deleted"].as_u64(), Some(1), "{v}");
    assert!(!exists(orphans[1].clone()).await);
    // Nothing any retained checkpoint references was touched: the latest still verifies deep.
    let (code, v, err) = run(&t, &[&["verify", "--deep"][..], &snap].concat()).await;
    assert_eq!(code, Some(0), "{err} {v}");
}

/// `blobsnap standby` follows the demo's task into the standby dir beside the task's store dir
/// on its own host, writes nothing to the blob store, and stops at `--until-seq`; a demo run
/// on that host then resumes from the committed offset with its counts right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_command_follows_the_demo_and_a_failover_links_from_it() {
    let tmp = tempfile::tempdir().unwrap();
    let t = local_target(tmp.path());
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let (code, v, err) = demo_run(&t, &a).await;
    assert_eq!(
        (code, &v["check"]),
        (Some(0), &serde_json::json!("ok")),
        "{err}"
    );
    let (_, ls, _) = run(&t, &["ls"]).await;
    let (_, tasks) = ls["jobs"].as_object().unwrap().iter().next().unwrap();
    let seq = tasks["Partition 0"]["latest-seq"].as_u64().unwrap();
    let objects = tree(&tmp.path().join("store"));

    let b_dir = b.display().to_string();
    let until = seq.to_string();
    let (code, v, err) = run(
        &t,
        &[
            "standby",
            "--dir",
            &b_dir,
            "--poll-ms",
            "20",
            "--until-seq",
            &until,
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["applied"], seq, "{v}");
    assert_eq!(
        tree(&tmp.path().join("store")),
        objects,
        "the standby wrote nothing to the blob store"
    );
    // A task that has no checkpoint (here a typo): said at once, with the tasks that have;
    // the standby keeps waiting (it is stopped by a signal, exit 10).
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
        .args(&t.args)
        .args([
            "standby",
            "--dir",
            &b_dir,
            "--poll-ms",
            "20",
            "--task",
            "Partition 9",
        ])
        .env("XDG_CACHE_HOME", cache_dir())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(child.stderr.take().unwrap()));
    let said = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while let Some(l) = lines.next_line().await.unwrap() {
            if l.contains("no checkpoint yet") {
                return l;
            }
        }
        panic!("the standby ended without saying the task has no checkpoint");
    })
    .await
    .expect("said within 60 s");
    assert!(
        said.contains("Partition 9") && said.contains("tasks with checkpoints: Partition 0"),
        "{said}"
    );
    let pid = rustix::process::Pid::from_raw(child.id().unwrap() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = wait_within(&mut child).await;
    assert_eq!(status.code(), Some(10), "stopped by the signal");

    let standby = b.join("state/counts/Partition_0.blobsnap-standby");
    assert!(standby.join("RESTORED").is_file(), "{}", standby.display());
    assert!(
        !b.join("state/counts/Partition_0").exists(),
        "not the task's store dir"
    );

    // Host a is gone: the task runs on host b, from the standby's copy.
    let (code, v, err) = demo_run(&t, &b).await;
    assert_eq!(
        (code, &v["check"]),
        (Some(0), &serde_json::json!("ok")),
        "{err}"
    );
    assert_eq!(
        v["tasks"][0]["resumed-from"],
        serde_json::json!(a_offset(&a)),
        "{v}"
    );
    // The demo says where its store came from: all of it from the standby's copy (nothing
    // was committed since the standby applied the last checkpoint).
    let r = &v["tasks"][0]["restored"]["counts"];
    assert!(r["files"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(r["files-from-standby"], r["files-reused"], "{v}");
    assert_eq!(r["files-reused"], r["files"], "{v}");
    assert_eq!(r["files-downloaded"], 0, "{v}");

    // Host c restores lazily: the demo says what came after the store opened.
    let c = tmp.path().join("c");
    let (code, v, err) = run(
        &t,
        &[
            "demo",
            "--dir",
            &c.display().to_string(),
            "--partitions",
            "1",
            "--lines",
            "3000",
            "--restore-mode",
            "lazy",
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["check"], "ok", "{v}");
    let r = &v["tasks"][0]["restored"]["counts"];
    let remote = r["files-left-remote"].as_u64().unwrap();
    assert!(
        remote > 0 && remote <= r["files-downloaded"].as_u64().unwrap(),
        "{v}"
    );
    assert_eq!(r["files-from-standby"], 0, "{v}");
}

/// One demo run of 3,000 lines on one partition in `dir`.
async fn demo_run(t: &Target, dir: &Path) -> (Option<i32>, serde_json::Value, String) {
    let dir = dir.display().to_string();
    run(
        t,
        &[
            "demo",
            "--dir",
            &dir,
            "--partitions",
            "1",
            "--lines",
            "3000",
        ],
    )
    .await
}

/// Every file below `dir`, relative path → content.
fn tree(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap().display().to_string();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

/// The input offset the demo on `dir` committed last (its partition file's length: the demo
/// ran to the end of its input).
fn a_offset(dir: &Path) -> u64 {
    std::fs::metadata(dir.join("input/0.txt")).unwrap().len()
}

/// `blobsnap cost` after a demo run: per-commit requests and a monthly bill in JSON, at the
/// commit interval given; a job with no checkpoints is not found (exit 3). The limit flags
/// are checked as flags: a rate that is not one is a usage error, zero transfers invalid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cost_of_a_demo_job_and_the_limit_flags() {
    let tmp = tempfile::tempdir().unwrap();
    let t = local_target(tmp.path());
    let dir = tmp.path().join("demo").display().to_string();
    let (code, _, err) = run(
        &t,
        &[
            "--max-upload-rate",
            "64MiB/s",
            "--max-request-rate",
            "2000",
            "demo",
            "--dir",
            &dir,
            "--partitions",
            "2",
            "--lines",
            "3000",
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    let (code, v, err) = run(
        &t,
        &["cost", "--job", "wordcount", "--commit-interval", "60s"],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["schema"], 1, "{v}");
    assert_eq!(v["tasks"], 2, "{v}");
    assert!(v["sampled-task-commits"].as_u64().unwrap() >= 2, "{v}");
    let put = v["per-commit"]["put"].as_f64().unwrap();
    assert!(
        put >= 2.0,
        "every task commit PUTs at least its checkpoint: {v}"
    );
    assert_eq!(v["commit-interval-secs"], 60.0, "{v}");
    let month = &v["monthly"];
    assert!(
        (month["commits"].as_f64().unwrap() - 43_200.0).abs() < 1e-6,
        "{v}"
    );
    // PUT and LIST at $0.005, GET at $0.0004 per 1,000 (the demo's sweep, every 20 commits,
    // is spread over them), deletes free.
    let c = &v["per-commit"];
    let per = |k: &str| c[k].as_f64().unwrap() * 43_200.0 / 1000.0;
    let usd = month["requests-usd"].as_f64().unwrap();
    let expected = (per("put") + per("list")) * 0.005 + per("get") * 0.0004;
    // The JSON is rounded (dollars to 1e-6, requests per commit to 1e-4): within that.
    assert!(
        (usd - expected).abs() < 1e-4 * expected.max(1.0),
        "{usd} vs {expected}: {v}"
    );
    let digits = |x: &serde_json::Value| x.to_string().split('.').nth(1).map_or(0, str::len);
    assert!(digits(&month["total-usd"]) <= 6, "rounded: {v}");
    assert!(digits(&c["get"]) <= 4, "rounded: {v}");
    assert!(v["stored-bytes"].as_u64().unwrap() > 0, "{v}");

    // Durations take the same forms on every flag: plain seconds, or 90s, 1d.
    for interval in ["60", "60s", "1m"] {
        let (code, v, err) = run(
            &t,
            &["cost", "--job", "wordcount", "--commit-interval", interval],
        )
        .await;
        assert_eq!(code, Some(0), "{interval}: {err}");
        assert_eq!(v["commit-interval-secs"], 60.0, "{interval}: {v}");
    }
    for grace in ["86400", "1d", "24h"] {
        let (code, v, err) = run(
            &t,
            &[
                "gc",
                "--job",
                "wordcount",
                "--grace-secs",
                grace,
                "--dry-run",
            ],
        )
        .await;
        assert_eq!(code, Some(0), "{grace}: {err}");
        assert_eq!(
            v["grace-secs"].as_u64().or(Some(86_400)),
            Some(86_400),
            "{v}"
        );
        let (code, _, err) = run(&t, &["usage", "--job", "wordcount", "--grace-secs", grace]).await;
        assert_eq!(code, Some(0), "{grace}: {err}");
    }
    let (code, _, err) = run(&t, &["gc", "--job", "wordcount", "--grace-secs", "soon"]).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("give seconds (90) or a duration (90s, 1d)"),
        "{err}"
    );
    let (code, _, err) = run(&t, &["cost", "--job", "nope"]).await;
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("no job stored under nope/1/"), "{err}");
    let (code, _, err) = run(&t, &["--max-upload-rate", "fast", "ls"]).await;
    assert_eq!(code, Some(2), "{err}");
    let (code, _, err) = run(&t, &["--max-transfers", "0", "ls"]).await;
    assert_eq!(code, Some(5), "{err}");
}

/// `restore --to` takes any path shape a user types — a bare relative name (whose parent is
/// the empty path: the swap's fsync of it used to fail *after* the dir was replaced, exit 3,
/// staging left behind), `./r`, `a/r` (a new parent), `../x/r`, an absolute path, a trailing
/// slash, a symlink to a directory (restored into its target, the link kept) — and each
/// restores the snapshot's keys with no staging dir left beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_to_every_path_shape() {
    let tmp = tempfile::tempdir().unwrap();
    let t = local_target(tmp.path());
    let dbdir = tmp.path().join("srcdb");
    {
        let db = RocksStore::open("x", &dbdir).unwrap();
        write_keys(&db, 0, 500);
        db.db().flush().unwrap();
    }
    let keys_in = |dir: &Path| -> Vec<(Vec<u8>, Vec<u8>)> {
        let db = RocksStore::open("check", dir).unwrap();
        db.db()
            .iterator(rocksdb::IteratorMode::Start)
            .map(|r| {
                let (k, v) = r.unwrap();
                (k.to_vec(), v.to_vec())
            })
            .collect()
    };
    let want = keys_in(&dbdir);
    assert_eq!(want.len(), 500);
    let (code, _, err) = run(
        &t,
        &[
            "backup",
            "--db",
            dbdir.to_str().unwrap(),
            "--name",
            "shapes",
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    let cwd = tmp.path().join("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    let abs = tmp.path().join("abs-r");
    for (to, lands) in [
        ("r1".to_string(), cwd.join("r1")),
        ("./r2".to_string(), cwd.join("r2")),
        ("new/r3".to_string(), cwd.join("new/r3")),
        ("../x/r4".to_string(), tmp.path().join("x/r4")),
        ("r5/".to_string(), cwd.join("r5")),
        (abs.display().to_string(), abs.clone()),
    ] {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
            .args(&t.args)
            .args(["restore", "--name", "shapes", "--to", &to])
            .current_dir(&cwd)
            .env("XDG_CACHE_HOME", cache_dir())
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "restore --to {to}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let staging = blobsnap::local::swap::staging_dir(&lands).unwrap();
        assert!(!staging.exists(), "--to {to}: {} left", staging.display());
        assert_eq!(keys_in(&lands), want, "--to {to}");
    }
    // A symlink to a directory: the restore lands in its target, and the link stays a link.
    let target = tmp.path().join("link-target");
    std::fs::create_dir(&target).unwrap();
    std::os::unix::fs::symlink(&target, cwd.join("link")).unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
        .args(&t.args)
        .args(["restore", "--name", "shapes", "--to", "link"])
        .current_dir(&cwd)
        .env("XDG_CACHE_HOME", cache_dir())
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "restore --to link: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::symlink_metadata(cwd.join("link"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(keys_in(&target), want, "--to a symlinked dir");
    // A path through a regular file cannot be made: a local I/O error, exit 9, naming it.
    std::fs::write(cwd.join("afile"), b"x").unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
        .args(&t.args)
        .args(["restore", "--name", "shapes", "--to", "afile/r"])
        .current_dir(&cwd)
        .env("XDG_CACHE_HOME", cache_dir())
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(9), "{err}");
    assert!(err.contains("afile") && err.contains("[io]"), "{err}");
    assert_eq!(std::fs::read(cwd.join("afile")).unwrap(), b"x");
}

/// Every object of the store, with its bytes.
async fn objects(store: &Arc<dyn BlobStore>) -> std::collections::BTreeMap<String, Vec<u8>> {
    let all = blobsnap::blobstore::list_all(store.as_ref(), &blobsnap::blobstore::Scope::root())
        .await
        .unwrap();
    let mut out = std::collections::BTreeMap::new();
    for m in all {
        let bytes = blobsnap::blobstore::get_bytes(store.as_ref(), &m.key, 1 << 30)
            .await
            .unwrap();
        out.insert(m.key.as_str().to_string(), bytes.to_vec());
    }
    out
}

/// The sweep fails closed: when a root it must read — the index an older retained
/// checkpoint names (gone, then corrupt), or a checkpoint document itself — cannot be read,
/// `gc` deletes nothing (an orphan past the grace included), touches nothing (`scope.json`
/// included: every object's bytes are compared), and says which checkpoint names what, and
/// how to repair it (exit 3 / 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_fails_closed_on_an_unreadable_root_and_names_the_repair() {
    use blobsnap::checkpoint::{BlobCheckpointStore, CheckpointStore as _};
    let tmp = tempfile::tempdir().unwrap();
    let t = local_target(tmp.path());
    let demo = tmp.path().join("demo").display().to_string();
    demo_ok(
        &t,
        &demo,
        "1",
        "3000",
        &["--commit-every", "500", "--retention", "3"],
    )
    .await;
    let job = JobScope::new("wordcount", "1").unwrap();
    let task = "Partition 0";
    let cps = BlobCheckpointStore::new(Arc::clone(&t.store), job.clone());
    let history = cps.history(task, usize::MAX).await.unwrap();
    assert!(history.len() >= 2, "{} retained", history.len());
    let older = &history[1];
    let marker: blobsnap::index::IndexMarker =
        older.checkpoint.as_v2().unwrap().state_checkpoint_markers[blobsnap::blob::FACTORY_NAME]
            ["counts"]
            .parse()
            .unwrap();
    let index_key = job
        .store(task, "counts")
        .unwrap()
        .index_key(&marker)
        .unwrap();
    let orphan = job
        .store(task, "counts")
        .unwrap()
        .key(&format!("blobs/1000-0/{}", "cd".repeat(32)))
        .unwrap();
    t.store
        .put(
            &orphan,
            PutBody::Bytes(b"orphan".to_vec().into()),
            PutOptions::default(),
        )
        .await
        .unwrap();
    let good_index = blobsnap::blobstore::get_bytes(t.store.as_ref(), &index_key, 1 << 30)
        .await
        .unwrap();
    let gc = ["gc", "--job", "wordcount", "--grace-secs", "0", "--force"];

    // The index gone.
    t.store
        .delete_many(std::slice::from_ref(&index_key))
        .await
        .unwrap();
    let before = objects(&t.store).await;
    assert!(before.keys().any(|k| k.ends_with("scope.json")));
    let (code, _, err) = run(&t, &gc).await;
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains(&format!("checkpoint #{}", older.seq))
            && err.contains("older retained checkpoint")
            && err.contains("deletes nothing"),
        "names the checkpoint and the repair: {err}"
    );
    assert_eq!(
        objects(&t.store).await,
        before,
        "nothing deleted or touched"
    );

    // The index corrupt.
    let mut bad = good_index.to_vec();
    bad[0] ^= 0x20;
    t.store
        .put(
            &index_key,
            PutBody::Bytes(bad.into()),
            PutOptions::default(),
        )
        .await
        .unwrap();
    let before = objects(&t.store).await;
    let (code, _, err) = run(&t, &gc).await;
    assert_eq!(code, Some(4), "{err}");
    assert_eq!(
        objects(&t.store).await,
        before,
        "nothing deleted or touched"
    );

    // The checkpoint document corrupt (the index good again).
    t.store
        .put(
            &index_key,
            PutBody::Bytes(good_index),
            PutOptions::default(),
        )
        .await
        .unwrap();
    let cp_key = blobsnap::blobstore::list_all(t.store.as_ref(), &job.checkpoints(task).unwrap())
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.key)
        .find(|k| k.as_str().ends_with(&format!("/{:020}.json", older.seq)))
        .unwrap_or_else(|| panic!("the key of checkpoint #{}", older.seq));
    t.store
        .put(
            &cp_key,
            PutBody::Bytes(b"{ not a checkpoint".to_vec().into()),
            PutOptions::default(),
        )
        .await
        .unwrap();
    let before = objects(&t.store).await;
    let (code, _, err) = run(&t, &gc).await;
    assert_eq!(code, Some(4), "{err}");
    assert_eq!(
        objects(&t.store).await,
        before,
        "nothing deleted or touched"
    );
}

/// `usage` and `cost` with one older retained index gone (issue 51, item 2): where `gc`
/// fails closed, both still report what they can read — `usage` every object classified,
/// `cost` its estimate from the rest — name the index they could not read and its root
/// (`unreadable-roots`, `"partial": true`), and exit 4 saying "partial" (as `checkpoints`
/// does). What the lost index may name (an orphan of its store) is `maybe-live`, never an
/// orphan; an orphan of another store still is one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_and_cost_report_what_they_read_when_an_older_index_is_gone() {
    use blobsnap::checkpoint::{BlobCheckpointStore, CheckpointStore as _};
    let tmp = tempfile::tempdir().unwrap();
    let t = local_target(tmp.path());
    let demo = tmp.path().join("demo").display().to_string();
    demo_ok(
        &t,
        &demo,
        "2",
        "3000",
        &["--commit-every", "500", "--retention", "3"],
    )
    .await;
    // What the demo itself left to sweep (a pre-uploaded file a compaction deleted first, the
    // snapshots its last commit let go) goes first: the orphans below are the only ones.
    let (code, _, err) = run(
        &t,
        &["gc", "--job", "wordcount", "--grace-secs", "0", "--force"],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    let job = JobScope::new("wordcount", "1").unwrap();
    let cps = BlobCheckpointStore::new(Arc::clone(&t.store), job.clone());
    let history = cps.history("Partition 1", usize::MAX).await.unwrap();
    let older = &history[1];
    let marker: blobsnap::index::IndexMarker =
        older.checkpoint.as_v2().unwrap().state_checkpoint_markers[blobsnap::blob::FACTORY_NAME]
            ["counts"]
            .parse()
            .unwrap();
    let index_key = job
        .store("Partition 1", "counts")
        .unwrap()
        .index_key(&marker)
        .unwrap();
    // An orphan in the lost index's store (it may name it), and one in another store.
    let orphan = |task: &str| {
        job.store(task, "counts")
            .unwrap()
            .key(&format!("blobs/1000-0/{}", "cd".repeat(32)))
            .unwrap()
    };
    for task in ["Partition 0", "Partition 1"] {
        t.store
            .put(
                &orphan(task),
                PutBody::Bytes(b"orphan".to_vec().into()),
                PutOptions::default(),
            )
            .await
            .unwrap();
    }
    let saved = blobsnap::blobstore::get_bytes(t.store.as_ref(), &index_key, 1 << 30)
        .await
        .unwrap();
    t.store
        .delete_many(std::slice::from_ref(&index_key))
        .await
        .unwrap();
    let (code, _, err) = run(&t, &["gc", "--job", "wordcount", "--dry-run"]).await;
    assert_eq!(code, Some(3), "gc fails closed: {err}");

    let partial = |what: &str, code: Option<i32>, v: &serde_json::Value, err: &str| {
        assert_eq!(code, Some(4), "{what}: {err}");
        let last: serde_json::Value = serde_json::from_str(err.lines().last().unwrap()).unwrap();
        assert_eq!(last["error"]["kind"], "corrupt", "{what}: {err}");
        let message = last["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("partial") && message.contains(index_key.as_str()),
            "{what}: {message}"
        );
        assert_eq!(v["partial"], true, "{what}: {v}");
    };
    let (code, v, err) = run(&t, &["usage", "--job", "wordcount", "--grace-secs", "0"]).await;
    partial("usage", code, &v, &err);
    let u = &v["usage"];
    assert_eq!(u["partial"], true, "{v}");
    let lost = &u["unreadable-roots"];
    assert_eq!(lost.as_array().unwrap().len(), 1, "{v}");
    assert_eq!(lost[0]["what"], "index", "{v}");
    assert_eq!(lost[0]["key"], index_key.as_str(), "{v}");
    assert_eq!(lost[0]["kind"], "not-found", "{v}");
    assert_eq!(
        lost[0]["root"],
        format!(
            "task \"Partition 1\" checkpoint #{} store counts",
            older.seq
        ),
        "{v}"
    );
    let class = |c: &str| u["classes"][c]["objects"].as_u64().unwrap();
    assert!(class("live") > 0 && class("metadata") > 0, "{v}");
    // The orphan the lost index may name, and any blob only it named (a compaction between
    // it and the newer checkpoints): never orphans (the one orphan is the other store's).
    assert!(
        class("maybe-live") >= 1,
        "the orphan the lost index may name: {v}"
    );
    assert_eq!(
        class("orphans-past-grace"),
        1,
        "the other store's orphan: {v}"
    );
    let sum: u64 = u["classes"]
        .as_object()
        .unwrap()
        .values()
        .map(|c| c["objects"].as_u64().unwrap())
        .sum();
    assert_eq!(
        Some(sum),
        u["total-objects"].as_u64(),
        "every object classified: {v}"
    );

    let (code, v, err) = run(
        &t,
        &["cost", "--job", "wordcount", "--commit-interval", "60s"],
    )
    .await;
    partial("cost", code, &v, &err);
    assert_eq!(v["unreadable-roots"][0]["key"], index_key.as_str(), "{v}");
    assert_eq!(v["tasks"], 2, "{v}");
    assert!(v["stored-bytes"].as_u64().unwrap() > 0, "{v}");
    assert!(v["sampled-task-commits"].as_u64().unwrap() >= 1, "{v}");
    assert!(v["monthly"]["total-usd"].as_f64().is_some(), "{v}");

    // The text names the index and its root too.
    for cmd in [
        &["usage", "--job", "wordcount"][..],
        &["cost", "--job", "wordcount"][..],
    ] {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
            .args(&t.args)
            .args(cmd)
            .output()
            .await
            .unwrap();
        assert_eq!(out.status.code(), Some(4), "{cmd:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(&format!(
                "UNREADABLE index of task \"Partition 1\" checkpoint #{} store counts",
                older.seq
            )),
            "{cmd:?}: {text}"
        );
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("partial report"),
            "{cmd:?}"
        );
    }

    // The index back: both are whole again, and the lost index's orphan is one.
    t.store
        .put(&index_key, PutBody::Bytes(saved), PutOptions::default())
        .await
        .unwrap();
    let (code, v, err) = run(&t, &["usage", "--job", "wordcount", "--grace-secs", "0"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["partial"], false, "{v}");
    assert_eq!(v["usage"]["classes"]["maybe-live"]["objects"], 0, "{v}");
    assert_eq!(
        v["usage"]["classes"]["orphans-past-grace"]["objects"], 2,
        "{v}"
    );
    let (code, v, err) = run(
        &t,
        &["cost", "--job", "wordcount", "--commit-interval", "60s"],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["partial"], false, "{v}");
    assert_eq!(v["unreadable-roots"].as_array().unwrap().len(), 0, "{v}");
}

/// How long a signal test waits for a child's next step before it fails as hung (item 16 of
/// issue 46: a graceful stop that deadlocks fails its test with what the child said, instead
/// of hanging the suite until CI's limit). A bound, not a pace: every step is an event.
const HANG: std::time::Duration = std::time::Duration::from_secs(120);

/// Read `lines` (a child's stderr) into `seen` up to a line containing `needle`: false if the
/// stream ended first; a panic naming the needle if neither happens within [`HANG`].
async fn read_until(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStderr>>,
    needle: &str,
    seen: &mut String,
) -> bool {
    let read = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            seen.push_str(&line);
            seen.push('\n');
            if line.contains(needle) {
                return true;
            }
        }
        false
    };
    match tokio::time::timeout(HANG, read).await {
        Ok(found) => found,
        Err(_) => panic!("hung: no {needle:?} within {HANG:?}"),
    }
}

/// Wait for `child` to exit: its status, or a panic if it has not within [`HANG`].
async fn wait_within(child: &mut tokio::process::Child) -> std::process::ExitStatus {
    match tokio::time::timeout(HANG, child.wait()).await {
        Ok(status) => status.unwrap(),
        Err(_) => panic!("hung: the child did not exit within {HANG:?}"),
    }
}

/// Read the rest of `lines` into `seen` and wait for `child` to exit: its status, or a panic
/// (what it said so far) if it has not exited within [`HANG`].
async fn drain_and_wait(
    child: &mut tokio::process::Child,
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStderr>>,
    seen: &mut String,
) -> std::process::ExitStatus {
    let drain = async {
        while let Ok(Some(line)) = lines.next_line().await {
            seen.push_str(&line);
            seen.push('\n');
        }
        child.wait().await.unwrap()
    };
    match tokio::time::timeout(HANG, drain).await {
        Ok(status) => status,
        Err(_) => panic!("hung: the child did not exit within {HANG:?}"),
    }
}

/// A task at the end of its input waits for its lazily restored store to be complete — but a
/// stop cuts that wait (N13 of the second protocol review): the demo, restored lazily with a
/// background download of 1 byte/s, is held at `task.end-of-input`, gets SIGTERM, and exits
/// 10 at once naming the offset it committed (the end of the input); a rerun completes the
/// store and ends with the independent count. Before the fix it waited for the whole download
/// (here, forever).
///
/// Why a file is still remote at the end of the input, by construction: three commits of 300
/// lines leave three L0 tables and no compaction (RocksDB's trigger is four); the lazy open
/// loads two (a table cache of 10 ÷ 4), and a rerun at the end of its input reads nothing
/// more, so the third stays with the background download, paced at 1 byte/s. (Ten commits
/// could leave four L0 tables, whose compaction at the open read, and so fetched, them all.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_cuts_the_wait_for_a_lazy_download() {
    use tokio::io::AsyncBufReadExt as _;
    let tmp = tempfile::tempdir().unwrap();
    let t = local_target(tmp.path());
    let demo = tmp.path().join("demo");
    let first = [
        "--partitions",
        "1",
        "--lines",
        "900",
        "--commit-every",
        "300",
    ];
    let (code, _, err) = run(
        &t,
        &[&["demo", "--dir", demo.to_str().unwrap()][..], &first[..]].concat(),
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    std::fs::remove_dir_all(demo.join("state")).unwrap();
    let cfg = tmp.path().join("lazy.toml");
    std::fs::write(
        &cfg,
        "[job]\nrestore-mode = \"lazy\"\nlazy-download-rate = 1\n",
    )
    .unwrap();
    let go = tmp.path().join("go");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
        .args(&t.args)
        .arg("--config")
        .arg(&cfg)
        .env("XDG_CACHE_HOME", cache_dir())
        .env("BLOBSNAP_HOLD_AT", "task.end-of-input")
        .env("BLOBSNAP_HOLD_UNTIL", &go)
        .kill_on_drop(true)
        .args(["demo", "--dir"])
        .arg(&demo)
        .args(first)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = rustix::process::Pid::from_raw(child.id().unwrap() as i32).unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = String::new();
    if !read_until(
        &mut lines,
        "hold point task.end-of-input reached",
        &mut seen,
    )
    .await
    {
        let status = child.wait().await.unwrap();
        panic!("the demo ended ({status}) before its end of input: {seen}");
    }
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    if !read_until(&mut lines, "stopping gracefully", &mut seen).await {
        panic!("no graceful stop: {seen}");
    }
    std::fs::write(&go, b"").unwrap();
    // Within the hang bound: the stop cut the wait for a download at 1 byte/s.
    let status = drain_and_wait(&mut child, &mut lines, &mut seen).await;
    assert_eq!(status.code(), Some(10), "exit 10 (cancelled): {seen}");
    assert!(
        seen.contains("while store \"counts\" was still downloading"),
        "{seen}"
    );
    // The rerun fetches what was still remote and ends with the input's counts.
    let (code, _, err) = run(
        &t,
        &[&["demo", "--dir", demo.to_str().unwrap()][..], &first[..]].concat(),
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
}

/// Ctrl-C is a graceful stop: the demo, held in its second commit, gets SIGINT, says it is
/// stopping, finishes that commit, commits what it processed since, deletes its writer lease
/// and exits 10 naming the offset it committed — which is the latest checkpoint's; a rerun
/// resumes from exactly there and ends with the independent count. A second signal stops at
/// once (exit 130).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_stops_the_demo_gracefully_and_a_second_one_at_once() {
    use blobsnap::checkpoint::{BlobCheckpointStore, CheckpointStore as _};
    use tokio::io::AsyncBufReadExt as _;
    let job = JobScope::new("wordcount", "1").unwrap();
    for second_signal in [false, true] {
        // A store and a demo dir of each run's own.
        let tmp = tempfile::tempdir().unwrap();
        let t = local_target(tmp.path());
        let demo = tmp.path().join("demo");
        let go = tmp.path().join("go");
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
            .args(&t.args)
            .env("XDG_CACHE_HOME", cache_dir())
            .env("BLOBSNAP_HOLD_AT", "commit.after-checkpoint@2")
            .env("BLOBSNAP_HOLD_UNTIL", &go)
            .kill_on_drop(true)
            .args(["demo", "--dir"])
            .arg(&demo)
            .args([
                "--partitions",
                "1",
                "--lines",
                "6000",
                "--commit-every",
                "300",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = rustix::process::Pid::from_raw(child.id().unwrap() as i32).unwrap();
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let mut seen = String::new();
        for needle in [
            "hold point commit.after-checkpoint reached",
            "stopping gracefully",
        ] {
            if !read_until(&mut lines, needle, &mut seen).await {
                let status = child.wait().await.unwrap();
                panic!("the demo ended ({status}) before {needle:?}: {seen}");
            }
            if needle.starts_with("hold") {
                rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
            }
        }
        if second_signal {
            rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
            let status = drain_and_wait(&mut child, &mut lines, &mut seen).await;
            assert_eq!(status.code(), Some(130), "{seen}");
            continue;
        }
        std::fs::write(&go, b"").unwrap();
        let status = drain_and_wait(&mut child, &mut lines, &mut seen).await;
        assert_eq!(status.code(), Some(10), "exit 10 (cancelled): {seen}");
        let offset: u64 = seen
            .split("after committing offset ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("names the committed offset: {seen}"));
        let cps = BlobCheckpointStore::new(Arc::clone(&t.store), job.clone());
        let latest = cps.latest("Partition 0").await.unwrap().unwrap();
        let committed = latest.checkpoint.as_v2().unwrap().input_offsets
            [&blobsnap::checkpoint::Ssp::new("files", "lines", 0)]
            .clone();
        assert_eq!(
            committed,
            offset.to_string(),
            "the last commit holds what was processed"
        );
        let leases = blobsnap::blobstore::list_all(t.store.as_ref(), &job.all_writers().unwrap())
            .await
            .unwrap();
        assert!(leases.is_empty(), "its writer lease is deleted: {leases:?}");
        let (code, v, err) = run(
            &t,
            &[
                "demo",
                "--dir",
                demo.to_str().unwrap(),
                "--partitions",
                "1",
                "--lines",
                "6000",
                "--commit-every",
                "300",
            ],
        )
        .await;
        assert_eq!(code, Some(0), "{err}");
        assert_eq!(v["check"], "ok", "{v}");
        assert_eq!(
            v["tasks"][0]["resumed-from"].as_u64(),
            Some(offset),
            "resumes from the offset the stop committed: {v}"
        );
    }
}

/// A restore cancelled while its swap is under way never claims the dir is unchanged (F15 of
/// the protocol review): held just before its swap (`restore.after-marker`), the restore gets
/// SIGINT; its cancel waits for the swap begun on its own thread, which completes once
/// released, and the command exits 10 saying the store was swapped in — and the dir holds the
/// snapshot, complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_cancelled_during_its_swap_says_what_it_did() {
    use tokio::io::AsyncBufReadExt as _;
    let tmp = tempfile::tempdir().unwrap();
    let t = local_target(tmp.path());
    let dbdir = tmp.path().join("srcdb");
    {
        let db = RocksStore::open("x", &dbdir).unwrap();
        write_keys(&db, 0, 800);
        db.db().flush().unwrap();
    }
    let (code, _, err) = run(
        &t,
        &["backup", "--db", dbdir.to_str().unwrap(), "--name", "swap"],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    let to = tmp.path().join("restored");
    let go = tmp.path().join("go");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
        .args(&t.args)
        .args(["restore", "--name", "swap", "--to"])
        .arg(&to)
        .env("XDG_CACHE_HOME", cache_dir())
        .env("BLOBSNAP_HOLD_AT", "restore.after-marker")
        .env("BLOBSNAP_HOLD_UNTIL", &go)
        .kill_on_drop(true)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = rustix::process::Pid::from_raw(child.id().unwrap() as i32).unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = String::new();
    for needle in [
        "hold point restore.after-marker reached",
        "stopping gracefully",
    ] {
        if !read_until(&mut lines, needle, &mut seen).await {
            let status = child.wait().await.unwrap();
            panic!("the restore ended ({status}) before {needle:?}: {seen}");
        }
        if needle.starts_with("hold") {
            rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
        }
    }
    std::fs::write(&go, b"").unwrap();
    let status = drain_and_wait(&mut child, &mut lines, &mut seen).await;
    assert_eq!(status.code(), Some(10), "{seen}");
    assert!(
        seen.contains("were swapped in") && !seen.contains("unchanged;"),
        "says the store was swapped in: {seen}"
    );
    assert!(to.join(blobsnap::index::RESTORED_MARKER).is_file());
    let db = RocksStore::open("check", &to).unwrap();
    assert_eq!(db.db().iterator(rocksdb::IteratorMode::Start).count(), 800);
}

/// Output to a closed pipe (`blobsnap ls | head -1`) ends quietly: exit 141, as a Unix tool
/// killed by SIGPIPE, and no panic message (it panicked, exit 101).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_to_a_closed_pipe_ends_quietly() {
    let tmp = tempfile::tempdir().unwrap();
    let t = local_target(tmp.path());
    let dbdir = tmp.path().join("db");
    {
        let db = RocksStore::open("x", &dbdir).unwrap();
        write_keys(&db, 0, 100);
    }
    for i in 0..3 {
        let (code, _, err) = run(
            &t,
            &[
                "backup",
                "--db",
                dbdir.to_str().unwrap(),
                "--name",
                &format!("b{i}"),
            ],
        )
        .await;
        assert_eq!(code, Some(0), "{err}");
    }
    // A reader that closes the pipe before the command writes.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
        .args(&t.args)
        .arg("ls")
        .env("XDG_CACHE_HOME", cache_dir())
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// `blobsnap completions SHELL` prints a script the shell accepts, generated from the
/// command's own definitions (every subcommand is offered), and `blobsnap man` a man page
/// naming every subcommand, a page per command (`man gc`, `man --dir DIR`); both end quietly on
/// a closed pipe; an unknown shell is a usage error (exit 2); help is wrapped to the
/// terminal's width, and `-h` leaves out the options every command takes (issue 51, item 12).
#[test]
fn completions_and_the_man_page_are_generated_from_the_commands() {
    let blobsnap = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
            .args(args)
            .output()
            .unwrap()
    };
    let subcommands = [
        "demo",
        "restore",
        "checkpoints",
        "savepoint",
        "usage",
        "completions",
    ];
    let bash = blobsnap(&["completions", "bash"]);
    assert!(bash.status.success(), "{bash:?}");
    let script = String::from_utf8(bash.stdout).unwrap();
    for sub in subcommands {
        assert!(script.contains(sub), "bash completion offers {sub}");
    }
    // Bash loads it and registers the completion of `blobsnap`.
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("blobsnap.bash");
    std::fs::write(&file, &script).unwrap();
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("source {} && complete -p blobsnap", file.display()))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("blobsnap"),
        "{out:?}"
    );
    for (shell, mark) in [
        ("zsh", "#compdef blobsnap"),
        ("fish", "complete -c blobsnap"),
    ] {
        let out = blobsnap(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(
            text.contains(mark),
            "{shell}: {}",
            &text[..text.len().min(200)]
        );
    }
    let man = blobsnap(&["man"]);
    assert!(man.status.success(), "{man:?}");
    let page = String::from_utf8(man.stdout).unwrap();
    assert!(
        page.starts_with(".ie") || page.contains(".TH blobsnap"),
        "{}",
        &page[..page.len().min(200)]
    );
    for sub in subcommands {
        assert!(page.contains(sub), "the man page names {sub}");
    }
    // Each command has its own page, printed or written with the others.
    let gc_page = blobsnap(&["man", "gc"]);
    let gc_page = String::from_utf8(gc_page.stdout).unwrap();
    assert!(gc_page.contains(".TH blobsnap-gc 1"), "{gc_page}");
    assert!(gc_page.contains("grace"), "{gc_page}");
    let nested = String::from_utf8(blobsnap(&["man", "savepoint", "create"]).stdout).unwrap();
    assert!(
        nested.contains(".TH blobsnap-savepoint-create 1"),
        "{nested}"
    );
    let typo = blobsnap(&["man", "savepoint", "crate"]);
    assert_eq!(typo.status.code(), Some(5), "{typo:?}");
    assert!(
        String::from_utf8_lossy(&typo.stderr).contains("create, ls"),
        "{typo:?}"
    );
    let pages = tempfile::tempdir().unwrap();
    let wrote = blobsnap(&["man", "--dir", pages.path().to_str().unwrap()]);
    assert!(wrote.status.success(), "{wrote:?}");
    let written: Vec<String> = std::fs::read_dir(pages.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    for page in [
        "blobsnap.1",
        "blobsnap-gc.1",
        "blobsnap-forget.1",
        "blobsnap-savepoint-rm.1",
    ] {
        assert!(written.iter().any(|w| w == page), "{page} in {written:?}");
    }
    // `-h` is short: the options every command takes are named in one line, `--help` has them.
    let short = String::from_utf8(blobsnap(&["gc", "-h"]).stdout).unwrap();
    let long = String::from_utf8(blobsnap(&["gc", "--help"]).stdout).unwrap();
    assert!(
        !short.contains("--s3-endpoint <") && short.contains("Options of every command"),
        "{short}"
    );
    assert!(
        long.contains("--s3-endpoint <") && long.contains("--grace-secs"),
        "{long}"
    );
    assert!(
        short.contains("--grace-secs") && short.lines().count() < 30,
        "{short}"
    );
    // Help text is wrapped to the terminal's width (COLUMNS where it is not a terminal).
    for columns in ["60", "100"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
            .args(["restore", "--help"])
            .env("COLUMNS", columns)
            .output()
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let widest = text.lines().map(|l| l.chars().count()).max().unwrap_or(0);
        assert!(
            widest <= columns.parse().unwrap() && widest > 40,
            "COLUMNS={columns}: a line of {widest}"
        );
    }
    let bad = blobsnap(&["completions", "tcsh"]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    // A reader that closes the pipe first.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
        .arg("man")
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// Messages that tell the truth (issue 35 §2): `checkpoint show` reads blobsnap's own stored
/// checkpoint record (what `checkpoints/<task>/<seq>.json` holds: number, writer and the
/// checkpoint) as well as a bare CheckpointV2, and names what is wrong with a damaged one;
/// the demo rerun over a shorter input than the job committed says its input changed (exit 5,
/// nothing run) instead of reporting corrupt state — on a new host's fresh dir too (a
/// failover without the job's --lines) — while a longer one (the same lines and
/// more) resumes; a refused start-from leaves the input as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_show_reads_stored_records_and_a_changed_demo_input_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let t = local_target(tmp.path());
    let dir = tmp.path().join("demo").display().to_string();
    let demo = |lines: &'static str| {
        let dir = dir.clone();
        move || {
            vec![
                "demo".to_string(),
                "--dir".into(),
                dir.clone(),
                "--partitions".into(),
                "1".into(),
                "--lines".into(),
                lines.into(),
            ]
        }
    };
    let args = demo("400")();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, v, err) = run(&t, &args).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["check"], "ok", "{v}");
    // A job's first run is not a string of warnings: no "resetting it to empty" (that is for
    // a store added to a job that committed), the local-store warning once.
    assert!(!err.contains("resetting it to empty"), "{err}");
    assert!(err.matches("local blob store").count() <= 1, "{err}");

    // The latest stored record of the task, as the store holds it.
    let job = JobScope::new("wordcount", "1").unwrap();
    let cps = blobsnap::checkpoint::BlobCheckpointStore::new(Arc::clone(&t.store), job.clone());
    let latest = blobsnap::checkpoint::CheckpointStore::latest(&cps, "Partition 0")
        .await
        .unwrap()
        .unwrap();
    let key = job.checkpoint_key("Partition 0", latest.seq).unwrap();
    let bytes = blobsnap::blobstore::get_bytes(t.store.as_ref(), &key, 1 << 20)
        .await
        .unwrap();
    let record = tmp.path().join("record.json");
    std::fs::write(&record, &bytes).unwrap();
    let (code, v, err) = run(&t, &["checkpoint", "show", record.to_str().unwrap()]).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["seq"], latest.seq, "{v}");
    assert_eq!(v["writer"], latest.writer.as_str(), "{v}");
    let id = latest.checkpoint.as_v2().unwrap().id.to_string();
    assert_eq!(v["checkpoint"]["checkpoint-id"], id.as_str(), "{v}");
    // A bare CheckpointV2 still shows as before.
    let bare = tmp.path().join("bare.json");
    std::fs::write(&bare, latest.checkpoint.to_json().unwrap()).unwrap();
    let (code, v, err) = run(&t, &["checkpoint", "show", bare.to_str().unwrap()]).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["checkpoint-id"], id.as_str(), "{v}");
    // A record whose checkpoint is damaged: corrupt, naming the field.
    let mut doc: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    doc["checkpoint"]["checkpoint-id"] = "not-an-id".into();
    std::fs::write(&record, serde_json::to_vec(&doc).unwrap()).unwrap();
    let (code, _, err) = run(&t, &["checkpoint", "show", record.to_str().unwrap()]).await;
    assert_eq!(code, Some(4), "{err}");
    assert!(err.contains("not-an-id"), "{err}");

    // The same demo over a shorter input: refused before anything runs, naming the change.
    let args = demo("200")();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, err) = run(&t, &args).await;
    assert_eq!(code, Some(5), "{err}");
    assert!(
        err.contains("input changed") && err.contains("400") && err.contains("200"),
        "{err}"
    );
    let after = blobsnap::checkpoint::CheckpointStore::latest(&cps, "Partition 0")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(after.seq, latest.seq, "nothing was committed");
    // A new host (a fresh --dir, a failover) with fewer lines than the job committed: refused
    // the same way before anything runs, and the input it generated to check is gone.
    let fresh = tmp.path().join("failover");
    let (code, _, err) = run(
        &t,
        &[
            "demo",
            "--dir",
            fresh.to_str().unwrap(),
            "--partitions",
            "1",
            "--lines",
            "200",
        ],
    )
    .await;
    assert_eq!(code, Some(5), "{err}");
    assert!(
        err.contains("past the 200 lines")
            && err.contains("input would not hold")
            && err.contains("--lines"),
        "{err}"
    );
    assert!(
        !fresh.exists(),
        "the dir it made (the checked input) is gone"
    );
    // A dir that was there keeps what it held: only what the run made goes.
    let mine = tmp.path().join("mine");
    std::fs::create_dir_all(mine.join("input")).unwrap();
    std::fs::write(mine.join("input/notes.txt"), b"mine").unwrap();
    let (code, _, err) = run(
        &t,
        &[
            "demo",
            "--dir",
            mine.to_str().unwrap(),
            "--partitions",
            "1",
            "--lines",
            "200",
        ],
    )
    .await;
    assert_eq!(code, Some(5), "{err}");
    assert_eq!(
        std::fs::read(mine.join("input/notes.txt")).unwrap(),
        b"mine"
    );
    let after = blobsnap::checkpoint::CheckpointStore::latest(&cps, "Partition 0")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(after.seq, latest.seq, "nothing was committed");
    // A longer one extends the same lines: the job resumes and its check holds.
    let args = demo("600")();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, v, err) = run(&t, &args).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["check"], "ok", "{v}");
    assert_eq!(
        v["tasks"][0]["processed"], 200,
        "resumed after line 400: {v}"
    );
    // A start-from no task can take is refused before the input is written: a rerun with the
    // job's own arguments finds the input it left.
    let input = tmp.path().join("demo").join("input");
    let params = || std::fs::read_to_string(input.join("PARAMS")).unwrap();
    assert_eq!(params(), "1 600 42\n");
    let mut args = demo("900")();
    args[4] = "3".into(); // --partitions 3
    args.extend(["--start-from".into(), "savepoint:none-such".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, err) = run(&t, &args).await;
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains("none-such") && err.contains("--partitions and --lines"),
        "{err}"
    );
    assert_eq!(params(), "1 600 42\n", "the input is as the job left it");
    // An input grown by a run that committed nothing past line 600 (a failed run of an
    // earlier version): the job's own --lines 600 is accepted, the input cut back to them.
    blobsnap::job::wordcount::generate_input(&input, 1, 900, 42).unwrap();
    let args = demo("600")();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, v, err) = run(&t, &args).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["check"], "ok", "{v}");
    assert_eq!(v["tasks"][0]["processed"], 0, "{v}");
    assert_eq!(params(), "1 600 42\n");
}

/// An endpoint that does not answer is reported within seconds — what is retried and until
/// when — not after the retry budget's two silent minutes (issue 35 §2): `ls` against a
/// loopback port where nothing listens says so on stderr at its third attempt (about a second
/// in; the 60 s bound only turns a silence into a failure).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_endpoint_is_reported_within_seconds() {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
        .args([
            "--bucket",
            "blobsnap-test",
            "--s3-endpoint",
            "http://127.0.0.1:9",
            "--s3-path-style",
            "--s3-region",
            "us-east-1",
            "ls",
        ])
        .env("AWS_ACCESS_KEY_ID", "dead")
        .env("AWS_SECRET_ACCESS_KEY", "endpoint")
        .env("XDG_CACHE_HOME", cache_dir())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(child.stderr.take().unwrap()));
    let said = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while let Some(l) = lines.next_line().await.unwrap() {
            if l.contains("retrying until") {
                return l;
            }
        }
        panic!("ls ended without saying it was retrying");
    })
    .await
    .expect("reported within 60 s");
    assert!(
        said.contains("list the whole store")
            && said.contains("could not reach the server")
            && said.contains("retry budget left"),
        "{said}"
    );
    child.kill().await.unwrap();
}

/// The environment names a store the way the error says it does (issue 35 §2): with no
/// store given the error names `BLOBSNAP_LOCAL_DIR` (and `BLOBSNAP_STORE=local` alone is not
/// enough: it would be the relative default), and `BLOBSNAP_LOCAL_DIR` then works.
#[test]
fn the_environment_names_a_store_as_the_error_says() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    std::fs::create_dir_all(&store).unwrap();
    let ls = |env: &[(&str, &std::ffi::OsStr)]| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"));
        for k in [
            "BLOBSNAP_STORE",
            "BLOBSNAP_LOCAL_DIR",
            "BLOBSNAP_CONFIG",
            "BLOBSNAP_S3_BUCKET",
        ] {
            c.env_remove(k);
        }
        c.current_dir(tmp.path())
            .arg("ls")
            .envs(env.iter().copied());
        c.output().unwrap()
    };
    for env in [
        vec![],
        vec![("BLOBSNAP_STORE", std::ffi::OsStr::new("local"))],
    ] {
        let out = ls(&env);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(5), "{env:?}: {err}");
        assert!(
            err.contains("BLOBSNAP_LOCAL_DIR=DIR") && err.contains("--local DIR"),
            "{env:?}: {err}"
        );
    }
    assert!(
        !tmp.path().join("blobsnap-store").exists(),
        "no default dir made"
    );
    for env in [
        vec![("BLOBSNAP_LOCAL_DIR", store.as_os_str())],
        vec![
            ("BLOBSNAP_STORE", std::ffi::OsStr::new("local")),
            ("BLOBSNAP_LOCAL_DIR", store.as_os_str()),
        ],
    ] {
        let out = ls(&env);
        assert!(
            out.status.success(),
            "{env:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The "restore with" hint after a backup is a command that works when pasted (issue 35 §2):
/// it carries the store flags the backup was given, shell-quoted (here a store path with a
/// space and a quote), and restores the database's keys, the latest backup and this one.
#[test]
fn the_restore_hint_after_a_backup_works_when_pasted() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("my store's dir");
    let dbdir = tmp.path().join("db");
    {
        let db = RocksStore::open("x", &dbdir).unwrap();
        write_keys(&db, 0, 300);
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
        .arg("--local")
        .arg(&root)
        .args(["backup", "--db"])
        .arg(&dbdir)
        .args(["--name", "mydb"])
        .env("XDG_CACHE_HOME", cache_dir())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    let after = |label: &str| {
        let i = lines
            .iter()
            .position(|l| l.contains(label))
            .unwrap_or_else(|| panic!("no {label:?} in {err}"));
        lines[i + 1].trim().to_string()
    };
    for (label, to) in [("latest backup", "r1"), ("this one with", "r2")] {
        let cmd = after(label);
        assert!(cmd.starts_with("blobsnap --local "), "{cmd}");
        let target = tmp.path().join(to);
        let pasted = cmd
            .replacen("blobsnap", env!("CARGO_BIN_EXE_blobsnap"), 1)
            .replace("--to DIR", &format!("--to {}", target.display()));
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&pasted)
            .env("XDG_CACHE_HOME", cache_dir())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{pasted}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let db = RocksStore::open("x", &target).unwrap();
        assert_eq!(
            db.db().iterator(rocksdb::IteratorMode::Start).count(),
            300,
            "{pasted}"
        );
    }
}

/// Manual backups through time (issue 32 §2): four backups of a changing database, `forget
/// --keep 2` (a dry run first: nothing removed), `gc --name` frees what only the forgotten
/// ones held (`usage` then shows no leak), and the newest backup still restores the
/// database's keys. A typo'd job is exit 3 for `gc`, `check` and `usage`, never "0 roots".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_backups_are_forgotten_by_policy_and_typos_fail_loudly() {
    let tmp = tempfile::tempdir().unwrap();
    let t = local_target(tmp.path());
    let dbdir = tmp.path().join("mydb");
    for round in 0..4u32 {
        {
            let db = RocksStore::open("x", &dbdir).unwrap();
            write_keys(&db, round * 1000, 1000);
            db.db().flush().unwrap();
            db.db().compact_range::<&[u8], &[u8]>(None, None);
        }
        let (code, _, err) = run(
            &t,
            &["backup", "--db", dbdir.to_str().unwrap(), "--name", "nb"],
        )
        .await;
        assert_eq!(code, Some(0), "{err}");
    }
    let count = |v: &serde_json::Value| v["tasks"]["backup"].as_array().map_or(0, Vec::len);
    let (code, v, err) = run(&t, &["checkpoints", "--name", "nb"]).await;
    assert_eq!((code, count(&v)), (Some(0), 4), "{err} {v}");
    let (code, v, err) = run(&t, &["forget", "--name", "nb", "--keep", "2", "--dry-run"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["forget"]["removed"].as_array().unwrap().len(), 2, "{v}");
    let (_, v, _) = run(&t, &["checkpoints", "--name", "nb"]).await;
    assert_eq!(count(&v), 4, "a dry run removes nothing: {v}");
    let (code, v, err) = run(&t, &["forget", "--name", "nb", "--keep", "last 2"]).await;
    assert_eq!(code, Some(0), "{err}");
    let kept: Vec<u64> = v["forget"]["kept"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(kept, [4, 3], "the newest two: {v}");
    let (_, v, _) = run(&t, &["checkpoints", "--name", "nb"]).await;
    assert_eq!(count(&v), 2, "{v}");
    // What manual backups cost: per backup and their storage, not a month of "commits" at
    // the spacing of backups made by hand; a schedule is priced when given.
    let (code, v, err) = run(&t, &["cost", "--name", "nb"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["manual"], true, "{v}");
    assert_eq!(v["retained-points"], 2, "{v}");
    assert_eq!(v["monthly"]["commits"].as_f64(), Some(0.0), "{v}");
    assert_eq!(v["monthly"]["requests-usd"].as_f64(), Some(0.0), "{v}");
    assert!(v["per-commit"]["put"].as_f64() >= Some(1.0), "{v}");
    let (code, v, err) = run(&t, &["cost", "--name", "nb", "--commit-interval", "1d"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["monthly"]["commits"].as_f64(), Some(30.0), "{v}");
    let (code, v, err) = run(&t, &["gc", "--name", "nb", "--grace-secs", "0", "--force"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(
        v["deleted"].as_u64() > Some(0),
        "the forgotten backups' own blobs: {v}"
    );
    let (code, v, err) = run(
        &t,
        &[
            "usage",
            "--job",
            "manual",
            "--job-id",
            "nb",
            "--grace-secs",
            "0",
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        v["usage"]["classes"]["orphans-past-grace"]["objects"], 0,
        "{v}"
    );
    let to = tmp.path().join("restored");
    let (code, _, err) = run(
        &t,
        &["restore", "--name", "nb", "--to", to.to_str().unwrap()],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    let keys = |p: &Path| {
        let db = RocksStore::open("x", p).unwrap();
        db.db()
            .iterator(rocksdb::IteratorMode::Start)
            .map(|kv| kv.unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(keys(&to), keys(&dbdir));
    for cmd in [
        &["gc", "--job", "wordcnt", "--dry-run"][..],
        &["check", "--job", "wordcnt"][..],
        &["usage", "--job", "wordcnt"][..],
    ] {
        let (code, _, err) = run(&t, cmd).await;
        assert_eq!(code, Some(3), "{cmd:?}: {err}");
        assert!(
            err.contains("no job stored under wordcnt/1/"),
            "{cmd:?}: {err}"
        );
    }
}

/// Unix manners (issue 35 §2): `--version` names the bundled RocksDB — the one Cargo.lock
/// builds — and the formats, as the library's constants say; a command that only reads never
/// creates a mistyped `--local` dir (exit 3 naming it); with `--json`, the last line of
/// stderr is the error as a JSON object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_names_rocksdb_and_the_formats_and_a_typo_creates_nothing() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
        .arg("--version")
        .output()
        .unwrap();
    let v = String::from_utf8_lossy(&out.stdout).into_owned();
    let lock =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.lock")).unwrap();
    let sys = lock
        .split("[[package]]")
        .find(|p| p.contains("name = \"librocksdb-sys\""))
        .and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = \"")))
        .map(|v| v.trim_end_matches('"').to_string())
        .unwrap();
    let rocksdb = sys.split('+').nth(1).unwrap();
    assert!(
        v.contains(&format!(
            "RocksDB {rocksdb} (bundled: librocksdb-sys {sys})"
        )),
        "{v}"
    );
    assert!(
        v.contains(&format!(
            "format-version {} or {} written ({} by a fork), {} to {} read",
            blobsnap::index::FORMAT_V1,
            blobsnap::index::FORMAT_INLINE,
            blobsnap::index::FORMAT_FORK,
            blobsnap::index::FORMAT_V1,
            blobsnap::index::FORMAT_VERSION
        )),
        "{v}"
    );
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("no-such-store");
    for cmd in [
        &["ls"][..],
        &["checkpoints", "--job", "wordcount"][..],
        &["usage", "--job", "w"][..],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
            .arg("--json")
            .arg("--local")
            .arg(&missing)
            .args(cmd)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(3), "{cmd:?}: {out:?}");
        assert!(!missing.exists(), "{cmd:?} created the mistyped store dir");
        let err = String::from_utf8_lossy(&out.stderr);
        let last: serde_json::Value = serde_json::from_str(err.lines().last().unwrap()).unwrap();
        assert_eq!(last["error"]["kind"], "not-found", "{err}");
        assert_eq!(last["error"]["exit-code"], 3, "{err}");
        assert!(
            last["error"]["message"]
                .as_str()
                .unwrap()
                .contains("no-such-store"),
            "{err}"
        );
    }
}

/// Typos fail loudly (issue 35 §2): `restore`, `inspect`, `verify` and `diff` name an unknown
/// job and list the jobs the store holds, list the tasks that have a checkpoint for an unknown task (an unquoted `Partition 0`
/// included, with or without a reference), and list the stores for an unknown store — exit 3,
/// nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_job_task_or_store_lists_what_exists() {
    let tmp = tempfile::tempdir().unwrap();
    let t = local_target(tmp.path());
    let dir = tmp.path().join("demo").display().to_string();
    let (code, _, err) = run(
        &t,
        &["demo", "--dir", &dir, "--partitions", "2", "--lines", "500"],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    let to = tmp.path().join("to").display().to_string();
    let tasks = r#"its tasks: "Partition 0", "Partition 1""#;
    for (args, says) in [
        (
            vec!["restore", "--job", "wordcnt", "--task", "Partition 0"],
            "the store holds wordcount/1",
        ),
        (
            vec!["restore", "--job", "wordcount", "--task", "Partition 9"],
            tasks,
        ),
        (
            vec!["inspect", "--job", "wordcount", "--task", "Partition", "0"],
            tasks,
        ),
        (
            vec!["verify", "--job", "wordcount", "--task", "Partition", "#1"],
            tasks,
        ),
        (
            vec![
                "restore",
                "--job",
                "wordcount",
                "--task",
                "Partition 0",
                "--store",
                "count",
            ],
            r#"has no snapshot of store "count"; its stores: "counts""#,
        ),
    ] {
        let mut args = args.clone();
        if !args.contains(&"--store") {
            args.extend(["--store", "counts"]);
        }
        if args[0] == "restore" {
            args.extend(["--to", &to]);
        }
        let (code, _, err) = run(&t, &args).await;
        assert_eq!(code, Some(3), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    assert!(!Path::new(&to).exists(), "nothing restored");
}

/// `checkpoints` labels every row a newcomer would wonder about (issue 35 §2, found by a
/// newcomer's walk): the task's first claim (an empty row), a claim repeating the checkpoint
/// before it, and the head a rollback committed (`start-from`, with the savepoint's id and
/// offsets under a newer number); the savepoint pins the checkpoint it recorded, not the
/// rollback head that repeats its id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_label_claims_and_a_rollback_head() {
    let tmp = tempfile::tempdir().unwrap();
    let t = local_target(tmp.path());
    let dir = tmp.path().join("demo").display().to_string();
    let demo = |lines: &'static str, extra: &[&'static str]| {
        let mut a = vec![
            "demo",
            "--dir",
            &dir,
            "--partitions",
            "1",
            "--lines",
            lines,
            "--retention",
            "20",
        ];
        a.extend(extra);
        a.into_iter().map(str::to_string).collect::<Vec<_>>()
    };
    let go = |args: Vec<String>| {
        let t = &t;
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let (code, v, err) = run(t, &args).await;
            assert_eq!(code, Some(0), "{args:?}: {err}");
            v
        }
    };
    go(demo("3000", &[])).await;
    go(
        ["savepoint", "create", "--job", "wordcount", "--name", "sp"]
            .map(str::to_string)
            .to_vec(),
    )
    .await;
    go(demo("6000", &[])).await;
    // The rollback with the savepoint's own (shorter) input: its offsets lie within it, so it
    // is not refused as a changed input (the input is cut back to 3000 lines).
    go(demo("3000", &["--start-from", "savepoint:sp"])).await;
    let list = go(["checkpoints", "--job", "wordcount"]
        .map(str::to_string)
        .to_vec())
    .await;
    let rows = list["tasks"]["Partition 0"].as_array().unwrap();
    let shown = go(["savepoint", "show", "--job", "wordcount", "--name", "sp"]
        .map(str::to_string)
        .to_vec())
    .await;
    let text = shown.to_string();
    // The savepoint's checkpoint: the row pinned by it.
    let pinned: Vec<_> = rows
        .iter()
        .filter(|r| {
            r["savepoints"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s == "sp")
        })
        .collect();
    assert_eq!(pinned.len(), 1, "one row pinned: {list}");
    let pinned = pinned[0];
    let heads: Vec<_> = rows
        .iter()
        .filter(|r| r["start-from"] == "savepoint:sp")
        .collect();
    assert_eq!(heads.len(), 1, "one rollback head: {list}");
    let head = heads[0];
    assert_eq!(head["checkpoint-id"], pinned["checkpoint-id"], "{list}");
    assert_eq!(head["input-offsets"], pinned["input-offsets"], "{list}");
    assert!(head["seq"].as_u64() > pinned["seq"].as_u64(), "{list}");
    assert_eq!(head["repeats"], serde_json::Value::Null, "{list}");
    assert!(
        text.contains(pinned["checkpoint-id"].as_str().unwrap()),
        "the savepoint records the pinned row's checkpoint: {text}"
    );
    // Two later runs began with a claim repeating the checkpoint before it; the first run's
    // claim is the oldest row, empty.
    let claims = rows.iter().filter(|r| r["repeats"].is_u64()).count();
    assert!(claims >= 2, "{list}");
    let oldest = rows.last().unwrap();
    assert_eq!(oldest["seq"], 1, "{list}");
    assert!(oldest["stores"].as_object().unwrap().is_empty(), "{list}");
    // The text says the same.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
        .args(&t.args)
        .args(["checkpoints", "--job", "wordcount"])
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("(start-from savepoint:sp: its offsets and state)")
            && text.contains("(claim: repeats #")
            && text.contains("(claim: the task's first start, nothing committed before)"),
        "{text}"
    );
}

/// N8 of the second protocol review: a task that stops on an error while a commit is in
/// flight waits for that commit before it lets its stores go (the commit used to run on
/// detached, the database open, while the process went on or an embedder restarted the
/// task). The demo's input has a line that is not UTF-8 at line 2,000; its first commit (at
/// line 300) is held before its checkpoint write, and processing goes on (a commit due
/// meanwhile is skipped) until the read of that line fails. The task then says it waits for
/// its commit in flight, and only once the commit is let go does the process exit, with
/// that commit's offset as the latest checkpoint. Without the wait, the process exited with
/// the commit still held: the stream ends before the line the test waits for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_stopping_on_an_error_waits_for_its_commit_in_flight() {
    use blobsnap::checkpoint::{BlobCheckpointStore, CheckpointStore as _};
    use tokio::io::AsyncBufReadExt as _;
    let tmp = tempfile::tempdir().unwrap();
    let t = local_target(tmp.path());
    let demo = tmp.path().join("demo");
    let demo_args = |cmd: &mut tokio::process::Command| {
        cmd.args(&t.args)
            .env("XDG_CACHE_HOME", cache_dir())
            .kill_on_drop(true)
            .args(["demo", "--dir"])
            .arg(&demo)
            .args([
                "--partitions",
                "1",
                "--lines",
                "3000",
                "--commit-every",
                "300",
            ]);
    };
    // The input, written by a first run killed right after its claim (nothing processed).
    let mut first = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"));
    demo_args(&mut first);
    let out = first
        .env("BLOBSNAP_CRASH_AT", "task.after-claim")
        .output()
        .await
        .unwrap();
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let input = demo.join("input").join("0.txt");
    let mut bytes = std::fs::read(&input).unwrap();
    let line_start = |n: usize| -> usize {
        bytes
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == b'\n')
            .nth(n - 1)
            .map(|(i, _)| i + 1)
            .unwrap()
    };
    let (after_300, bad) = (line_start(300), line_start(1999));
    bytes[bad] = 0xFF;
    std::fs::write(&input, &bytes).unwrap();

    let go = tmp.path().join("go");
    let mut second = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"));
    demo_args(&mut second);
    let mut child = second
        .env("BLOBSNAP_HOLD_AT", "commit.before-checkpoint@1")
        .env("BLOBSNAP_HOLD_UNTIL", &go)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = String::new();
    for needle in [
        "hold point commit.before-checkpoint reached",
        "waiting for its commit in flight",
    ] {
        if !read_until(&mut lines, needle, &mut seen).await {
            let status = drain_and_wait(&mut child, &mut lines, &mut seen).await;
            panic!("the demo ended ({status}) before {needle:?}, its commit still held: {seen}");
        }
    }
    std::fs::write(&go, b"").unwrap();
    let status = drain_and_wait(&mut child, &mut lines, &mut seen).await;
    assert!(!status.success(), "the read error fails the run: {seen}");
    assert!(seen.contains("read input"), "{seen}");
    let cps = BlobCheckpointStore::new(
        Arc::clone(&t.store),
        JobScope::new("wordcount", "1").unwrap(),
    );
    let latest = cps.latest("Partition 0").await.unwrap().unwrap();
    let offset = &latest.checkpoint.as_v2().unwrap().input_offsets
        [&blobsnap::checkpoint::Ssp::new("files", "lines", 0)];
    assert_eq!(
        offset,
        &after_300.to_string(),
        "the held commit landed before the process exited"
    );
}

/// A graceful stop of a job of several tasks deletes every task's writer lease (issue 51,
/// item 7): the job used to end at the first task that stopped, while the others were still
/// committing and closing, and their lease deletes were cancelled with the runtime ("blocking
/// task was cancelled"); from another host those leases then refused `gc` for the whole
/// grace. Here one task's first commit is held after its checkpoint write when SIGINT comes,
/// so the other task (60,000 lines: far from its end) stops first, every time; once the held
/// one is let go, the process exits 10 naming what each task committed, and no lease is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_of_several_tasks_leaves_no_writer_lease() {
    use futures::TryStreamExt as _;
    use tokio::io::AsyncBufReadExt as _;
    let tmp = tempfile::tempdir().unwrap();
    let t = local_target(tmp.path());
    let go = tmp.path().join("go");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
        .args(&t.args)
        .env("XDG_CACHE_HOME", cache_dir())
        .env("BLOBSNAP_HOLD_AT", "commit.after-checkpoint@1")
        .env("BLOBSNAP_HOLD_UNTIL", &go)
        .kill_on_drop(true)
        .args(["demo", "--dir"])
        .arg(tmp.path().join("demo"))
        .args([
            "--partitions",
            "2",
            "--lines",
            "60000",
            "--commit-every",
            "300",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = rustix::process::Pid::from_raw(child.id().unwrap() as i32).unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = String::new();
    for needle in [
        "hold point commit.after-checkpoint reached",
        "stopping gracefully",
    ] {
        if !read_until(&mut lines, needle, &mut seen).await {
            let status = drain_and_wait(&mut child, &mut lines, &mut seen).await;
            panic!("the demo ended ({status}) before {needle:?}: {seen}");
        }
        if needle.starts_with("hold") {
            rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
        }
    }
    std::fs::write(&go, b"").unwrap();
    let status = drain_and_wait(&mut child, &mut lines, &mut seen).await;
    assert_eq!(status.code(), Some(10), "exit 10 (stopped): {seen}");
    // The exit names what every task committed, not only the first's.
    for task in ["Partition 0", "Partition 1"] {
        assert!(
            seen.contains(&format!(
                "task {task:?} stopped on request after committing offset"
            )),
            "{seen}"
        );
    }
    let writers = JobScope::new("wordcount", "1")
        .unwrap()
        .all_writers()
        .unwrap();
    let left: Vec<String> = t
        .store
        .list(&writers)
        .map_ok(|m| m.key.as_str().to_string())
        .try_collect()
        .await
        .unwrap();
    assert!(
        left.is_empty(),
        "leases left after a graceful stop: {left:?}\n{seen}"
    );
    assert!(
        !seen.contains("could not delete the writer lease"),
        "{seen}"
    );
}

/// `blobsnap unlock` (issue 51, item 7): of a stopped job's writer leases, one whose process
/// no longer runs on this host goes; one whose process runs here is never removed; another
/// host's within its grace stays until that host is named as stopped. A dry run removes
/// nothing; a kept lease exits 6 and says what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_releases_the_leases_of_a_stopped_job_and_never_a_live_one() {
    use blobsnap::blob::admin::{ProcessIdentity, WriterLease};
    use futures::TryStreamExt as _;
    let tmp = tempfile::tempdir().unwrap();
    let t = local_target(tmp.path());
    let job = JobScope::new("wordcount", "1").unwrap();
    let grace = std::time::Duration::from_secs(86_400);
    let (code, _, err) = run(&t, &["admin", "create", "--job", "wordcount"]).await;
    assert_eq!(code, Some(0), "{err}");
    // Partition 0: this very process, running.
    let live = WriterLease::new("Partition 0", grace);
    live.announce(t.store.as_ref(), &job).await.unwrap();
    // Partition 1: another host's, renewed now.
    let other = WriterLease {
        host: "jobhost-7".into(),
        pid: 4242,
        process: None,
        ..WriterLease::new("Partition 1", grace)
    };
    other.announce(t.store.as_ref(), &job).await.unwrap();
    // Partition 2: this host, a process that is gone (pid 1 never started at tick 1).
    let mut gone = WriterLease::new("Partition 2", grace);
    gone.pid = 1;
    gone.process = gone.process.map(|p| ProcessIdentity {
        start_ticks: 1,
        ..p
    });
    assert!(gone.is_gone(), "{gone:?}");
    gone.announce(t.store.as_ref(), &job).await.unwrap();
    let leases = || async {
        let scope = job.all_writers().unwrap();
        let mut keys: Vec<String> = t
            .store
            .list(&scope)
            .map_ok(|m| m.key.as_str().to_string())
            .try_collect()
            .await
            .unwrap();
        keys.sort();
        keys.len()
    };
    let verdicts = |v: &serde_json::Value| -> Vec<(String, String, bool)> {
        v["leases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                (
                    l["task"].as_str().unwrap().to_string(),
                    l["verdict"].as_str().unwrap().to_string(),
                    l["removed"].as_bool().unwrap(),
                )
            })
            .collect()
    };
    let unlock = |extra: &'static [&'static str]| {
        let t = &t;
        async move {
            let mut a = vec!["unlock", "--job", "wordcount"];
            a.extend_from_slice(extra);
            run(t, &a).await
        }
    };
    let (code, v, err) = unlock(&["--dry-run"]).await;
    assert_eq!(code, Some(6), "{err}");
    assert_eq!(
        verdicts(&v),
        [
            ("Partition 0".to_string(), "live".to_string(), false),
            ("Partition 1".to_string(), "other-host".to_string(), false),
            ("Partition 2".to_string(), "gone".to_string(), true),
        ]
    );
    assert_eq!(leases().await, 3, "a dry run removes nothing");
    assert!(err.contains("still runs on this host"), "{err}");
    let (code, _, err) = unlock(&[]).await;
    assert_eq!(code, Some(6), "{err}");
    assert_eq!(leases().await, 2, "the gone process's lease went");
    let (code, v, err) = unlock(&["--stopped-host", "jobhost-7"]).await;
    assert_eq!(code, Some(6), "{err}");
    assert_eq!(
        verdicts(&v),
        [
            ("Partition 0".to_string(), "live".to_string(), false),
            ("Partition 1".to_string(), "stopped-host".to_string(), true),
        ]
    );
    assert_eq!(leases().await, 1, "this process's lease is never removed");
    live.retire(t.store.as_ref(), &job).await.unwrap();
    let (code, v, err) = unlock(&[]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(v["leases"].as_array().unwrap().is_empty(), "{v}");
}

/// A time copied from `checkpoints` names the checkpoint it was printed beside (issue 51,
/// item 3): the demo commits several times a second, and a time printed to the second named
/// the checkpoint before (or none). Each row's time, from the text and from `time-utc`, given
/// as `@TIME` to `inspect`, resolves to that row's checkpoint; a time before the oldest says
/// which is the oldest and when, to the millisecond.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_time_copied_from_checkpoints_names_that_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let t = local_target(tmp.path());
    let dir = tmp.path().join("demo").display().to_string();
    demo_ok(
        &t,
        &dir,
        "1",
        "3000",
        &["--commit-every", "300", "--retention", "6"],
    )
    .await;
    let (code, list, err) = run(&t, &["checkpoints", "--job", "wordcount"]).await;
    assert_eq!(code, Some(0), "{err}");
    let rows: Vec<serde_json::Value> = list["tasks"]["Partition 0"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| !r["stores"].as_object().unwrap().is_empty())
        .cloned()
        .collect();
    assert!(rows.len() >= 4, "{list}");
    let text = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
        .args(&t.args)
        .args(["checkpoints", "--job", "wordcount"])
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    let resolve = |time: String| {
        let t = &t;
        async move {
            let (code, v, err) = run(
                t,
                &[
                    "inspect",
                    "--job",
                    "wordcount",
                    "--task",
                    "Partition 0",
                    "--store",
                    "counts",
                    &format!("@{time}"),
                ],
            )
            .await;
            assert_eq!(code, Some(0), "@{time}: {err}");
            v["checkpoint-id"].as_str().unwrap().to_string()
        }
    };
    for row in &rows {
        let id = row["checkpoint-id"].as_str().unwrap();
        let json_time = row["time-utc"].as_str().unwrap().to_string();
        // The text line of this row: `#N  ID  TIME  (LOCAL)  offsets`.
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("#{} ", row["seq"])))
            .unwrap_or_else(|| panic!("{text}"));
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words[1], id, "{line}");
        let text_time = words[2].to_string();
        assert_eq!(text_time, json_time, "{line}");
        // A claim repeats the id before it under the next number: the id is what is named.
        assert_eq!(resolve(text_time).await, id, "{line}\n{text}");
    }
    // The rows' times are distinct even where their seconds are not.
    let seconds: std::collections::BTreeSet<&str> = rows
        .iter()
        .map(|r| &r["time-utc"].as_str().unwrap()[..19])
        .collect();
    assert!(
        seconds.len() < rows.len(),
        "several checkpoints share a second (what made the bug): {list}"
    );

    // Before the oldest retained (with or without a snapshot: a task's first claim is an
    // empty checkpoint, retained when commits were skipped under load): not found, naming the
    // oldest and its time to the millisecond.
    let oldest = list["tasks"]["Partition 0"]
        .as_array()
        .unwrap()
        .last()
        .unwrap();
    let ms = oldest["time-millis"].as_u64().unwrap() - 1;
    let (code, _, err) = run(
        &t,
        &[
            "inspect",
            "--job",
            "wordcount",
            "--task",
            "Partition 0",
            "--store",
            "counts",
            &format!("@{ms}"),
        ],
    )
    .await;
    assert_eq!(code, Some(3), "{err}");
    let oldest_seq = list["tasks"]["Partition 0"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()["seq"]
        .as_u64()
        .unwrap();
    assert!(
        err.contains(&format!("the oldest retained is #{oldest_seq}, made "))
            && err.contains(&format!(
                "made at or before {}:",
                blobsnap::units::utc_millis(ms)
            )),
        "{err}"
    );
}

/// `#N` for a whole job once tasks' numbers diverge (issue 51, item 4): each task numbers
/// its own checkpoints and each start of a task takes a number, so after restarts one task is
/// ahead (here Partition 1 has two more claims). `savepoint create --at '#N'` and
/// `demo --start-from '#N'` for a number only one task has are refused (exit 3, nothing
/// written) saying what `#N` means for a job and naming what works for the whole job —
/// `latest`, `@TIME` (the time of the task's `#N` is given), a savepoint — and not the demo's
/// unrelated --dir/--partitions/--lines hint; the `@TIME` offered works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_wide_seq_that_tasks_do_not_share_says_what_works() {
    use blobsnap::checkpoint::{BlobCheckpointStore, CheckpointStore as _};
    let tmp = tempfile::tempdir().unwrap();
    let t = local_target(tmp.path());
    let dir = tmp.path().join("demo").display().to_string();
    let demo = |extra: &[&str]| {
        let mut a = vec![
            "demo".to_string(),
            "--dir".into(),
            dir.clone(),
            "--partitions".into(),
            "2".into(),
            "--lines".into(),
            "3000".into(),
            "--commit-every".into(),
            "500".into(),
            "--retention".into(),
            "10".into(),
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let go = |args: Vec<String>| {
        let t = &t;
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run(t, &args).await
        }
    };
    let (code, _, err) = go(demo(&[])).await;
    assert_eq!(code, Some(0), "{err}");
    // Partition 1 starts twice more than Partition 0: two claims, each repeating its latest
    // checkpoint under the next number (what a start writes).
    let job = JobScope::new("wordcount", "1").unwrap();
    let cps = BlobCheckpointStore::new(Arc::clone(&t.store), job.clone());
    let p0 = cps.history("Partition 0", 1).await.unwrap()[0].seq;
    let latest = cps.history("Partition 1", 1).await.unwrap().remove(0);
    for k in 1..=2 {
        cps.write("Partition 1", latest.seq + k, "w", &latest.checkpoint)
            .await
            .unwrap();
    }
    let ahead = latest.seq + 2;
    assert!(ahead > p0, "Partition 0 at #{p0}, Partition 1 at #{ahead}");
    let made = blobsnap::units::utc_millis(latest.checkpoint.as_v2().unwrap().id.millis());
    let n = format!("#{ahead}");

    let explains = |err: &str| {
        assert!(
            err.contains("task \"Partition 0\"")
                && err.contains(&format!("no retained checkpoint {n}"))
                && err.contains(&format!(
                    "For a whole job, {n} names each task's own checkpoint {n}"
                ))
                && err.contains(&format!("task \"Partition 1\" has a retained {n}"))
                && err.contains("`latest`, `@TIME`")
                && err.contains(&format!("task \"Partition 1\"'s {n} was made at `@{made}`"))
                && err.contains("`savepoint:NAME`")
                && err.contains("`blobsnap checkpoints --job wordcount`"),
            "{err}"
        );
    };
    let (code, _, err) = run(
        &t,
        &[
            "savepoint",
            "create",
            "--job",
            "wordcount",
            "--name",
            "x",
            "--at",
            &n,
        ],
    )
    .await;
    assert_eq!(code, Some(3), "{err}");
    explains(&err);
    let (code, v, err) = run(&t, &["savepoint", "ls", "--job", "wordcount"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        v["savepoints"].as_array().unwrap().len(),
        0,
        "nothing written: {v}"
    );

    let (code, _, err) = go(demo(&["--start-from", &n])).await;
    assert_eq!(code, Some(3), "{err}");
    explains(&err);
    assert!(
        !err.contains("Give the demo the --dir"),
        "the store has every task of this run: {err}"
    );

    // What the error offers works for the whole job.
    for (name, at) in [
        ("at-time", format!("@{made}")),
        ("at-latest", "latest".into()),
    ] {
        let (code, v, err) = run(
            &t,
            &[
                "savepoint",
                "create",
                "--job",
                "wordcount",
                "--name",
                name,
                "--at",
                &at,
            ],
        )
        .await;
        assert_eq!(code, Some(0), "{at}: {err}");
        assert_eq!(
            v["savepoint"]["tasks"].as_object().unwrap().len(),
            2,
            "{at}: {v}"
        );
    }
}

/// A rollback or a fork shows in the task's summary, and a start-from given again says it was
/// applied before and not again (issue 51, items 6 and 5): `started-from` in the JSON, a line
/// of its own in the text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_from_shows_in_the_summary_and_says_when_it_is_not_applied_again() {
    let tmp = tempfile::tempdir().unwrap();
    let t = local_target(tmp.path());
    let dir = |d: &str| tmp.path().join(d).display().to_string();
    let demo = |d: String, id: &'static str, lines: &'static str, extra: Vec<&'static str>| {
        let t = &t;
        async move { demo_one_task(t, &d, id, lines, &extra).await["tasks"][0]["started-from"].clone() }
    };
    assert_eq!(
        demo(dir("a"), "1", "900", vec![]).await,
        serde_json::Value::Null
    );
    let (code, _, err) = run(
        &t,
        &[
            "savepoint",
            "create",
            "--job",
            "wordcount",
            "--name",
            "base",
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    demo(dir("a"), "1", "1800", vec![]).await;
    let rollback = vec!["--start-from", "savepoint:base"];
    let first = demo(dir("a"), "1", "1800", rollback.clone()).await;
    let first = first.as_str().unwrap_or_default().to_string();
    assert!(
        first.starts_with("started from savepoint:base, checkpoint #")
            && first.contains("committed again as #"),
        "{first}"
    );
    let again = demo(dir("a"), "1", "1800", rollback.clone()).await;
    let again = again.as_str().unwrap_or_default().to_string();
    assert!(
        again.contains("start-from savepoint:base was applied before")
            && again.contains("not again")
            && again.contains("--start-from-id"),
        "{again}"
    );
    // Under a new id the same point is applied again — once: the same id again resumes.
    let with_id = |id: &'static str| {
        let mut a = rollback.clone();
        a.extend(["--start-from-id", id]);
        a
    };
    let second = demo(dir("a"), "1", "1800", with_id("incident-2")).await;
    let second = second.as_str().unwrap_or_default().to_string();
    assert!(
        second.starts_with("started from savepoint:base, checkpoint #"),
        "{second}"
    );
    assert_ne!(second, first, "a new head under a new number");
    let repeat = demo(dir("a"), "1", "1800", with_id("incident-2")).await;
    assert!(
        repeat
            .as_str()
            .unwrap_or_default()
            .contains("was applied before"),
        "{repeat}"
    );
    let fork = demo(
        dir("b"),
        "2",
        "1800",
        vec!["--start-from", "savepoint:wordcount/1/base"],
    )
    .await;
    let fork = fork.as_str().unwrap_or_default().to_string();
    assert!(fork.starts_with("forked from wordcount/1/base"), "{fork}");
    // The text names it too, on a line of its own.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
        .args(&t.args)
        .env("XDG_CACHE_HOME", cache_dir())
        .args([
            "demo",
            "--dir",
            &dir("a"),
            "--partitions",
            "1",
            "--lines",
            "1800",
            "--commit-every",
            "300",
            "--start-from",
            "savepoint:base",
        ])
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Partition 0: start-from savepoint:base was applied before"),
        "{text}"
    );
}

/// No AWS credentials anywhere in the default chain is a setting to fix: the command fails at
/// once (exit 8, permanent) naming the chain, instead of retrying "could not reach the server"
/// for the whole retry budget (found running the Samza plug-in without credentials: 116 s).
#[test]
fn no_aws_credentials_is_permanent_and_named() {
    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().join("empty");
    std::fs::write(&empty, b"").unwrap();
    // A loopback port nothing listens on: the request never gets that far.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"));
    for (k, _) in std::env::vars() {
        if k.starts_with("AWS_") || k.starts_with("BLOBSNAP_") {
            c.env_remove(k);
        }
    }
    let out = c
        .current_dir(tmp.path())
        .env("HOME", tmp.path())
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_CONFIG_FILE", &empty)
        .env("AWS_SHARED_CREDENTIALS_FILE", &empty)
        .args([
            "ls",
            "--bucket",
            "no-creds",
            "--s3-path-style",
            "--s3-region",
            "us-east-1",
        ])
        .arg("--s3-endpoint")
        .arg(format!("http://127.0.0.1:{port}"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no AWS credentials found"), "{err}");
    assert_eq!(out.status.code(), Some(8), "{err}");
}

/// A settings file without `[store]` keeps the demo on its own store, `--dir/store` (issue 51,
/// item 8: it moved the demo to the settings' default `./blobsnap-store`, a new empty store
/// whose first run replaced the task's state and started from offset 0); a command that needs
/// a store named says the file names none.
#[test]
fn a_settings_file_without_a_store_keeps_the_demo_on_its_own_store() {
    let tmp = tempfile::tempdir().unwrap();
    let cmd = |args: &[&str]| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"));
        for (k, _) in std::env::vars() {
            if k.starts_with("BLOBSNAP_") {
                c.env_remove(k);
            }
        }
        let out = c.current_dir(tmp.path()).args(args).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let demo = ["demo", "--dir", "d", "--partitions", "1"];
    let (code, _, err) = cmd(&[&demo[..], &["--lines", "300"]].concat());
    assert_eq!(code, Some(0), "{err}");
    std::fs::write(tmp.path().join("p.toml"), "[job]\npartitions = 1\n").unwrap();
    let (code, out, err) = cmd(&[&["--config", "p.toml"], &demo[..], &["--lines", "600"]].concat());
    assert_eq!(code, Some(0), "{err}");
    let all = format!("{out}{err}");
    assert!(
        all.contains(&format!(
            "blob store local:{}",
            tmp.path().join("d").join("store").display()
        )),
        "{all}"
    );
    assert!(
        all.contains("Partition 0: resumed from offset") && !all.contains("resumed from offset 0,"),
        "the second run resumes from the first's checkpoint: {all}"
    );
    assert!(!tmp.path().join("blobsnap-store").exists());
    let (code, _, err) = cmd(&["--config", "p.toml", "ls"]);
    assert_eq!(code, Some(5), "{err}");
    assert!(err.contains("p.toml names no store"), "{err}");
}

/// A standby whose --dir holds no demo store (and no store flags) is refused at once, exit 3,
/// naming the dir: it would otherwise wait forever for a job that is not there (issue 51,
/// item 10).
#[test]
fn a_standby_with_a_wrong_dir_is_refused_not_left_waiting() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"));
    for (k, _) in std::env::vars() {
        if k.starts_with("BLOBSNAP_") {
            c.env_remove(k);
        }
    }
    let out = c
        .current_dir(tmp.path())
        .args([
            "standby",
            "--dir",
            "nowhere",
            "--task",
            "Partition 0",
            "--stores",
            "counts",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("no blob store to stand by for") && err.contains("nowhere"),
        "{err}"
    );
    assert!(!tmp.path().join("nowhere").exists(), "nothing made");
}

/// What fails like a typo (issue 51, item 11): `savepoint ls` of a job the store does not
/// hold (exit 3, naming what it holds), and `ls` of a dir that is not a store — the demo's
/// --dir instead of its store — exit 3 naming the store it probably meant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typos_in_a_job_or_a_store_dir_fail_named() {
    let tmp = tempfile::tempdir().unwrap();
    let t = local_target(tmp.path());
    let dir = tmp.path().join("demo");
    demo_ok(&t, dir.to_str().unwrap(), "1", "200", &[]).await;
    let (code, _, err) = run(&t, &["savepoint", "ls", "--job", "wordcnt"]).await;
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains("wordcnt") && err.contains("wordcount/1"),
        "{err}"
    );
    // The demo with its own store under --dir, and `ls` pointed at --dir.
    let own = tmp.path().join("own");
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"));
    for (k, _) in std::env::vars() {
        if k.starts_with("BLOBSNAP_") {
            c.env_remove(k);
        }
    }
    let out = c
        .args(["demo", "--dir"])
        .arg(&own)
        .args(["--partitions", "1", "--lines", "200"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"));
    let out = c.arg("--local").arg(&own).arg("ls").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("no job stored here")
            && err.contains(&own.join("store").display().to_string()),
        "{err}"
    );
}

/// A restore leaves nothing beside its target (issue 51, item 12): no `<target>.blobsnap.lock`
/// after it succeeds, nor after it fails on a corrupt blob (exit 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_leaves_no_lock_file_beside_its_target() {
    let tmp = tempfile::tempdir().unwrap();
    let t = local_target(tmp.path());
    let dir = tmp.path().join("demo");
    demo_ok(&t, dir.to_str().unwrap(), "1", "400", &[]).await;
    let restore = |to: &Path| {
        let to = to.display().to_string();
        let t = &t;
        async move {
            run(
                t,
                &[
                    "restore",
                    "--job",
                    "wordcount",
                    "--task",
                    "Partition 0",
                    "--store",
                    "counts",
                    "--to",
                    &to,
                ],
            )
            .await
        }
    };
    let ok = tmp.path().join("ok");
    let (code, _, err) = restore(&ok).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(!tmp.path().join("ok.blobsnap.lock").exists());
    // The largest blob of the store, corrupted in place.
    let mut blobs: Vec<_> = walk_files(&tmp.path().join("store"))
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("/blobs/"))
        .collect();
    blobs.sort_by_key(|p| std::fs::metadata(p).unwrap().len());
    let big = blobs.last().expect("a blob");
    let mut bytes = std::fs::read(big).unwrap();
    bytes[0] ^= 1;
    std::fs::write(big, bytes).unwrap();
    let bad = tmp.path().join("bad");
    let (code, _, err) = restore(&bad).await;
    assert_eq!(code, Some(4), "{err}");
    assert!(!tmp.path().join("bad.blobsnap.lock").exists(), "{err}");
}

fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out
}

/// A dir blobsnap restored says whose store it holds: restoring another task's store over it
/// needs `--force` (issue 51, item 12); the same task's store replaces it as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restoring_over_another_task_s_restored_store_needs_force() {
    let tmp = tempfile::tempdir().unwrap();
    let t = local_target(tmp.path());
    let dir = tmp.path().join("demo");
    demo_ok(&t, dir.to_str().unwrap(), "2", "300", &[]).await;
    let to = tmp.path().join("r").display().to_string();
    let restore = |task: &'static str, extra: &'static [&'static str]| {
        let (t, to) = (&t, to.clone());
        async move {
            let mut args = vec![
                "restore",
                "--job",
                "wordcount",
                "--task",
                task,
                "--store",
                "counts",
                "--to",
            ];
            args.push(&to);
            args.extend_from_slice(extra);
            run(t, &args).await
        }
    };
    let (code, _, err) = restore("Partition 0", &[]).await;
    assert_eq!(code, Some(0), "{err}");
    let (code, _, err) = restore("Partition 0", &[]).await;
    assert_eq!(code, Some(0), "the same task's store again: {err}");
    let (code, _, err) = restore("Partition 1", &[]).await;
    assert_eq!(code, Some(5), "{err}");
    assert!(
        err.contains("holds store \"counts\" of task \"Partition 0\"") && err.contains("--force"),
        "{err}"
    );
    let (code, _, err) = restore("Partition 1", &["--force"]).await;
    assert_eq!(code, Some(0), "{err}");
    // A dry run writes nothing, not even its target's parent dirs (the lock file's).
    let deep = tmp
        .path()
        .join("x")
        .join("y")
        .join("p0")
        .display()
        .to_string();
    let (code, _, err) = run(
        &t,
        &[
            "restore",
            "--job",
            "wordcount",
            "--task",
            "Partition 0",
            "--store",
            "counts",
            "--to",
            &deep,
            "--dry-run",
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert!(!tmp.path().join("x").exists(), "a dry run made dirs");
}

/// Removing what is no longer wanted (issue 51, item 9): a fork's whole deployment with its pins
/// in the source, one checkpoint of a task, a retired deployment — a dry run first, each
/// refused while something still needs it (a fork borrowing, a live writer, the newest
/// checkpoint), and the job still resumes with its counts after one of its checkpoints went.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_removes_a_fork_a_deployment_and_one_checkpoint() {
    use blobsnap::checkpoint::CheckpointStore as _;
    use blobsnap::layout::JobScope;
    let tmp = tempfile::tempdir().unwrap();
    let t = local_target(tmp.path());
    let dir = |d: &str| tmp.path().join(d).display().to_string();
    let demo = |d: String, id: &'static str, lines: &'static str, extra: Vec<&'static str>| {
        let t = &t;
        async move {
            demo_one_task(t, &d, id, lines, &extra).await;
        }
    };
    let count = |job: JobScope| {
        let store = Arc::clone(&t.store);
        async move {
            blobsnap::blobstore::list_all(store.as_ref(), job.scope())
                .await
                .unwrap()
                .len()
        }
    };
    let source = JobScope::new("wordcount", "1").unwrap();
    let fork = JobScope::new("wordcount", "2").unwrap();
    demo(dir("a"), "1", "900", vec![]).await;
    let (code, _, err) = run(
        &t,
        &[
            "savepoint",
            "create",
            "--job",
            "wordcount",
            "--name",
            "base",
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    demo(dir("a"), "1", "1800", vec![]).await;
    // The fork commits its start and nothing more: its snapshot borrows the savepoint's blobs.
    demo(
        dir("b"),
        "2",
        "900",
        vec!["--start-from", "savepoint:wordcount/1/base"],
    )
    .await;
    let all = |id: &'static str| vec!["forget", "--all", "--job", "wordcount", "--job-id", id];

    // The source cannot go while the fork borrows from it.
    let (code, _, err) = run(&t, &all("1")).await;
    assert_eq!(code, Some(6), "{err}");
    assert!(
        err.contains("wordcount/2") && err.contains("forget --all --job wordcount --job-id 2"),
        "{err}"
    );

    // A running fork (a live writer lease) is refused.
    let lease = blobsnap::blob::admin::WriterLease::new(
        "Partition 0",
        std::time::Duration::from_secs(3600),
    );
    lease.announce(t.store.as_ref(), &fork).await.unwrap();
    let (code, _, err) = run(&t, &all("2")).await;
    assert_eq!(code, Some(6), "{err}");
    assert!(
        err.contains("is running") && err.contains("blobsnap unlock"),
        "{err}"
    );
    lease.retire(t.store.as_ref(), &fork).await.unwrap();

    // A dry run reports everything and deletes nothing.
    let before = count(fork.clone()).await;
    let pins_scope = source.fork_pins("base").unwrap();
    let pins = blobsnap::blobstore::list_all(t.store.as_ref(), &pins_scope)
        .await
        .unwrap();
    assert_eq!(
        pins.len(),
        1,
        "the fork's one task pins the savepoint: {pins:?}"
    );
    let mut dry = all("2");
    dry.push("--dry-run");
    let (code, v, err) = run(&t, &dry).await;
    assert_eq!(code, Some(0), "{err}");
    let r = &v["removed-deployment"];
    assert_eq!(r["dry-run"], true, "{v}");
    assert_eq!(r["objects"].as_u64(), Some(before as u64), "{v}");
    // A fork copies nothing: its indexes name the source's blobs.
    assert_eq!(r["blobs"].as_u64(), Some(0), "{v}");
    assert!(r["indexes"].as_u64().unwrap_or(0) > 0, "{v}");
    assert_eq!(r["pins-released"].as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(
        count(fork.clone()).await,
        before,
        "a dry run deletes nothing"
    );

    // What starts writing to the fork while the removal runs stops it before its next kind of
    // object (the removal held after one kind each time): a task's lease, then a claim — a
    // checkpoint document — written once the documents are gone.
    for (what, needle) in [
        ("lease", "started while its deployment was being removed"),
        (
            "claim",
            "appeared in wordcount/2 while its deployment was being removed",
        ),
    ] {
        use tokio::io::AsyncBufReadExt as _;
        let go = tmp.path().join(format!("go-forget-{what}"));
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
            .args(&t.args)
            .args(all("2"))
            .env("XDG_CACHE_HOME", cache_dir())
            .env("BLOBSNAP_HOLD_AT", "forget.mid-deployment")
            .env("BLOBSNAP_HOLD_UNTIL", &go)
            .kill_on_drop(true)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let mut seen = String::new();
        assert!(
            read_until(
                &mut lines,
                "hold point forget.mid-deployment reached",
                &mut seen
            )
            .await,
            "{seen}"
        );
        let claim = fork.checkpoint_key("Partition 0", 99).unwrap();
        if what == "lease" {
            lease.announce(t.store.as_ref(), &fork).await.unwrap();
        } else {
            t.store
                .put(
                    &claim,
                    blobsnap::blobstore::PutBody::Bytes(b"{}".to_vec().into()),
                    blobsnap::blobstore::PutOptions::default(),
                )
                .await
                .unwrap();
        }
        std::fs::write(&go, b"").unwrap();
        let status = drain_and_wait(&mut child, &mut lines, &mut seen).await;
        assert_eq!(status.code(), Some(6), "{what}: {seen}");
        assert!(seen.contains(needle), "{what}: {seen}");
        if what == "lease" {
            lease.retire(t.store.as_ref(), &fork).await.unwrap();
        }
    }
    let before = count(fork.clone()).await;
    // Killed after its next kind of object went, the removal leaves nothing that restores
    // (no readable checkpoint names a deleted blob) and runs again to the end.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
        .args(&t.args)
        .args(all("2"))
        .env("XDG_CACHE_HOME", cache_dir())
        .env("BLOBSNAP_CRASH_AT", "forget.mid-deployment")
        .output()
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        None,
        "killed at the crash point: {out:?}"
    );
    let cps = blobsnap::checkpoint::BlobCheckpointStore::new(Arc::clone(&t.store), fork.clone());
    assert!(
        cps.latest("Partition 0").await.unwrap().is_none(),
        "no checkpoint is left"
    );
    let left = count(fork.clone()).await;
    assert!(left > 0 && left < before, "{left} of {before} left");
    // The fork goes, and with it its pin in the source.
    let (code, v, err) = run(&t, &all("2")).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        v["removed-deployment"]["objects"].as_u64(),
        Some(left as u64),
        "{v}"
    );
    assert_eq!(count(fork.clone()).await, 0, "nothing of the fork is left");
    let pins = blobsnap::blobstore::list_all(t.store.as_ref(), &pins_scope)
        .await
        .unwrap();
    assert!(pins.is_empty(), "its pin is released: {pins:?}");

    // One checkpoint: the newest stays (it is what the task restores); an older one goes, is
    // listed as removed, and the job still resumes with its counts.
    let (code, v, err) = run(&t, &["checkpoints", "--job", "wordcount"]).await;
    assert_eq!(code, Some(0), "{err}");
    let history = v["tasks"]["Partition 0"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(history.len() >= 2, "{v}");
    let key = |i: usize| history[i]["key"].as_str().unwrap_or_default().to_string();
    let (code, _, err) = run(&t, &["forget", "--checkpoint", &key(0)]).await;
    assert_eq!(code, Some(5), "{err}");
    assert!(err.contains("newest the task can restore"), "{err}");
    let (code, v, err) = run(&t, &["forget", "--checkpoint", &key(1)]).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["removed-checkpoint"]["changed"], true, "{v}");
    let (code, v, err) = run(&t, &["checkpoints", "--job", "wordcount"]).await;
    assert_eq!(code, Some(0), "{err}");
    let removed: Vec<u64> = v["removed-checkpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["seq"].as_u64())
        .collect();
    assert_eq!(removed, vec![history[1]["seq"].as_u64().unwrap()], "{v}");
    demo(dir("a"), "1", "2100", vec![]).await;

    // A lost index costs its own line in `checkpoints`, not the listing: exit 4 "partial".
    let (_, v, _) = run(&t, &["checkpoints", "--job", "wordcount"]).await;
    let newest = &v["tasks"]["Partition 0"][0];
    let marker = newest["stores"]["counts"]["marker"]
        .as_str()
        .unwrap()
        .to_string();
    let index = source
        .store("Partition 0", "counts")
        .unwrap()
        .key(&marker)
        .unwrap();
    t.store.delete_many(&[index]).await.unwrap();
    let (code, v, err) = run(&t, &["checkpoints", "--job", "wordcount"]).await;
    assert_eq!(code, Some(4), "{err}");
    assert!(
        err.contains("partial") && err.contains("cannot be read"),
        "{err}"
    );
    assert_eq!(v["partial"], true, "{v}");
    let listed = v["tasks"]["Partition 0"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(listed.len() >= 2, "the others are listed: {v}");
    assert!(
        listed[0]["stores"]["counts"]["unreadable"]
            .as_str()
            .is_some(),
        "{v}"
    );
    assert!(listed[1]["stores"]["counts"]["unreadable"].is_null(), "{v}");
    assert!(
        listed[1]["stores"]["counts"]["files"].as_u64().unwrap_or(0) > 0,
        "{v}"
    );
    // With the newest's snapshot lost, the one before it is what a restore falls back to: it
    // stays.
    let older = listed[1]["key"].as_str().unwrap_or_default().to_string();
    let (code, _, err) = run(&t, &["forget", "--checkpoint", &older]).await;
    assert_eq!(code, Some(5), "{err}");
    assert!(err.contains("would not restore"), "{err}");

    // The retired deployment goes whole; asked again, it is not found.
    let (code, v, err) = run(&t, &all("1")).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(
        v["removed-deployment"]["savepoints"].as_u64() == Some(1),
        "{v}"
    );
    assert_eq!(count(source.clone()).await, 0, "nothing of the job is left");
    let (code, _, err) = run(&t, &all("1")).await;
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("no job stored under"), "{err}");
}

/// A one-task demo job whose head snapshot is named by a prepared history record only (its
/// checkpoint documents deleted: the commit point is Samza's, in Kafka).
struct PreparedOnly {
    job: JobScope,
    head: blobsnap::checkpoint::CheckpointV2,
    /// The largest document number the task had.
    top: u64,
    store_name: String,
    marker: String,
    /// The head snapshot's index.
    index: BlobKey,
}

async fn a_head_named_by_a_prepared_record_only(t: &Target, root: &Path) -> PreparedOnly {
    use blobsnap::checkpoint::{BlobCheckpointStore, CheckpointStore as _};
    let dir = root.join("a").display().to_string();
    demo_one_task(t, &dir, "1", "900", &[]).await;
    let job = JobScope::new("wordcount", "1").unwrap();
    let task = "Partition 0";
    let cps = BlobCheckpointStore::new(Arc::clone(&t.store), job.clone());
    let history = cps.history(task, usize::MAX).await.unwrap();
    let head = history[0].checkpoint.as_v2().unwrap().clone();
    let top = history.iter().map(|c| c.seq).max().unwrap();
    let (store_name, marker) = head.state_checkpoint_markers[blobsnap::blob::FACTORY_NAME]
        .iter()
        .next()
        .map(|(s, m)| (s.clone(), m.clone()))
        .unwrap();
    let index = job
        .store(task, &store_name)
        .unwrap()
        .index_key(&marker.parse().unwrap())
        .unwrap();
    blobsnap::blob::prepared::write(t.store.as_ref(), &job, task, &head)
        .await
        .unwrap();
    let docs: Vec<BlobKey> = history
        .iter()
        .map(|c| job.checkpoint_key(task, c.seq).unwrap())
        .collect();
    t.store.delete_many(&docs).await.unwrap();
    PreparedOnly {
        job,
        head,
        top,
        store_name,
        marker,
        index,
    }
}

/// A prepared history record (route 1 of the Samza plug-in under Kafka's checkpoint manager,
/// docs/samza.md) is a root: the snapshot it names survives a sweep past the grace while no
/// checkpoint document names it, and restores verified; dropped, the next sweep takes it; an
/// unreadable record stops the sweep before it deletes anything, naming the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_history_record_is_a_root_until_it_is_dropped() {
    use blobsnap::blob::prepared;
    let tmp = tempfile::tempdir().unwrap();
    let t = local_target(tmp.path());
    // The snapshot is named by a prepared record only: Samza's checkpoint (in Kafka) is the
    // commit point, blobsnap's history does not have it yet.
    let PreparedOnly {
        job,
        head,
        store_name,
        marker,
        index,
        ..
    } = a_head_named_by_a_prepared_record_only(&t, tmp.path()).await;
    let task = "Partition 0";
    let gc = ["gc", "--job", "wordcount", "--grace-secs", "0", "--force"];
    let (code, v, err) = run(&t, &gc).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(
        v["deleted"].as_u64().unwrap_or(0) > 0,
        "the other snapshots are orphans now: {v}"
    );
    let restore = |to: String| {
        let t = &t;
        let (marker, store_name) = (marker.clone(), store_name.clone());
        async move {
            run(
                t,
                &[
                    "restore",
                    &marker,
                    "--job",
                    "wordcount",
                    "--task",
                    task,
                    "--store",
                    &store_name,
                    "--to",
                    &to,
                ],
            )
            .await
        }
    };
    let (code, _, err) = restore(tmp.path().join("r1").display().to_string()).await;
    assert_eq!(
        code,
        Some(0),
        "the prepared snapshot restores after the sweep: {err}"
    );

    // Unreadable: the sweep deletes nothing and names the record.
    let key = job.prepared_key(task, &head.id).unwrap();
    let good = blobsnap::blobstore::get_bytes(t.store.as_ref(), &key, 1 << 20)
        .await
        .unwrap();
    t.store
        .put(
            &key,
            PutBody::Bytes(bytes::Bytes::from_static(b"{not json")),
            PutOptions::default(),
        )
        .await
        .unwrap();
    let (code, _, err) = run(&t, &gc).await;
    assert_ne!(
        code,
        Some(0),
        "an unreadable prepared record must stop the sweep"
    );
    assert!(
        err.contains("prepared history record") && err.contains(key.as_str()),
        "{err}"
    );
    t.store
        .put(&key, PutBody::Bytes(good), PutOptions::default())
        .await
        .unwrap();
    // A key under prepared/ of no record's shape may be one the sweep cannot read: the same.
    let stray = job.prepared(task).unwrap().key("notes.txt").unwrap();
    t.store
        .put(
            &stray,
            PutBody::Bytes(bytes::Bytes::from_static(b"x")),
            PutOptions::default(),
        )
        .await
        .unwrap();
    let (code, _, err) = run(&t, &gc).await;
    assert_ne!(
        code,
        Some(0),
        "a stray key under prepared/ must stop the sweep"
    );
    assert!(err.contains(stray.as_str()), "{err}");
    t.store.delete_many(&[stray]).await.unwrap();
    let listed = prepared::list(t.store.as_ref(), &job, None).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        prepared::read(t.store.as_ref(), &listed[0]).await.unwrap(),
        head
    );

    // Dropped (what the task's next start does with a record Samza never committed): swept.
    prepared::remove(t.store.as_ref(), &[key]).await.unwrap();
    let (code, v, err) = run(&t, &gc).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(v["deleted"].as_u64().unwrap_or(0) > 0, "{v}");
    assert!(
        matches!(t.store.head(&index).await, Err(e) if e.kind() == blobsnap::ErrorKind::NotFound),
        "the dropped record's index is swept"
    );
    let (code, _, _) = restore(tmp.path().join("r2").display().to_string()).await;
    assert_ne!(code, Some(0), "nothing left to restore");
}

/// A promotion racing a sweep (deterministic: the sweep is held right after it read the
/// prepared records): the record goes after the checkpoint document is written, and the sweep,
/// which lists the tasks and their histories only after the records, finds the document — the
/// promoted snapshot survives a sweep past the grace and restores. (Read in the other order, the
/// task had no document yet and the record was gone: the snapshot would be swept.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promotion_while_a_sweep_reads_its_roots_loses_nothing() {
    use blobsnap::blob::prepared;
    use blobsnap::checkpoint::{BlobCheckpointStore, Checkpoint, CheckpointStore as _};
    use tokio::io::AsyncBufReadExt as _;
    let tmp = tempfile::tempdir().unwrap();
    let t = local_target(tmp.path());
    // The commit point is elsewhere (Kafka): the task has no document, the record roots it.
    let PreparedOnly {
        job,
        head,
        top,
        store_name,
        marker,
        index,
    } = a_head_named_by_a_prepared_record_only(&t, tmp.path()).await;
    let task = "Partition 0";
    let cps = BlobCheckpointStore::new(Arc::clone(&t.store), job.clone());

    let go = tmp.path().join("go");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
        .args(&t.args)
        .args(["gc", "--job", "wordcount", "--grace-secs", "0", "--force"])
        .env("XDG_CACHE_HOME", cache_dir())
        .env("BLOBSNAP_HOLD_AT", "sweep.after-prepared")
        .env("BLOBSNAP_HOLD_UNTIL", &go)
        .kill_on_drop(true)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = String::new();
    assert!(
        read_until(
            &mut lines,
            "hold point sweep.after-prepared reached",
            &mut seen
        )
        .await,
        "the sweep ended before its hold point: {seen}"
    );
    // The promotion, while the sweep is held: the document first, then the record goes.
    cps.write(task, top + 1, "promoter", &Checkpoint::V2(head.clone()))
        .await
        .unwrap();
    prepared::remove(
        t.store.as_ref(),
        &[job.prepared_key(task, &head.id).unwrap()],
    )
    .await
    .unwrap();
    std::fs::write(&go, b"").unwrap();
    let status = drain_and_wait(&mut child, &mut lines, &mut seen).await;
    assert_eq!(status.code(), Some(0), "{seen}");
    assert!(
        t.store.head(&index).await.is_ok(),
        "the promoted snapshot's index was swept: {seen}"
    );
    let to = tmp.path().join("restored").display().to_string();
    let (code, _, err) = run(
        &t,
        &[
            "restore",
            &marker,
            "--job",
            "wordcount",
            "--task",
            task,
            "--store",
            &store_name,
            "--to",
            &to,
        ],
    )
    .await;
    assert_eq!(code, Some(0), "the promoted snapshot restores: {err}");
}
