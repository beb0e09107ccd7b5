//! `blobsnap backup --db` of a database written by another program's RocksDB: Debian's
//! RocksDB 7.8 (`ldb`, package rocksdb-tools), as Samza's RocksDB JNI and many applications
//! ship an older RocksDB than the bundled one. The backup must leave the database byte for
//! byte as it was (info logs aside), and the restore must open under that same older RocksDB
//! with every key and value — the old `backup --db` opened the database read-write with the
//! bundled RocksDB, which flushed its WAL and wrote a MANIFEST (format_version 7) that RocksDB
//! 7.8 refuses.
//!
//! `#[ignore]`d (needs `ldb`): scripts/test.sh installs rocksdb-tools and runs it. Without
//! `ldb` the test fails, naming the package.
//!
//! And the indexes Samza's own engine writes on blobsnap's layout (issue 50, route 2), which
//! blobsnap restores and verifies (no extra tool: run with the suite).

use crate::support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

fn ldb(db: &Path, args: &[&str]) -> String {
    let out = Command::new("ldb")
        .arg(format!("--db={}", db.display()))
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("run ldb ({e}): install Debian's rocksdb-tools (scripts/prereqs.sh --tools ldb)")
        });
    assert!(
        out.status.success(),
        "ldb {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn blobsnap(store: &Path, args: &[&str]) -> serde_json::Value {
    // The CLI's hash cache goes beside the test's store, never into the user's ~/.cache.
    let out = Command::new(env!("CARGO_BIN_EXE_blobsnap"))
        .arg("--local")
        .arg(store)
        .arg("--json")
        .args(args)
        .env("XDG_CACHE_HOME", store.with_extension("cache"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "blobsnap {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
#[ignore = "needs ldb (Debian rocksdb-tools); run by scripts/test.sh"]
fn a_rocksdb_7_database_is_unchanged_by_a_backup_and_restores_under_rocksdb_7() {
    let version = Command::new("ldb")
        .arg("--version")
        .output()
        .unwrap_or_else(|e| {
            panic!("run ldb ({e}): install Debian's rocksdb-tools (scripts/prereqs.sh --tools ldb)")
        });
    let version = String::from_utf8_lossy(&version.stdout).to_string();
    assert!(
        version.contains("RocksDB 7."),
        "an older RocksDB than the bundled one: {version}"
    );
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("appdb");
    let store = tmp.path().join("store");
    // Two batches (each a flush into an SST at ldb's close), then one more batch.
    let mut expected = BTreeMap::new();
    for batch in 0..3 {
        let mut args = vec!["--create_if_missing".to_string(), "batchput".to_string()];
        for i in 0..200 {
            let (k, v) = (format!("key-{batch}-{i:04}"), format!("value {batch}/{i}"));
            args.push(k.clone());
            args.push(v.clone());
            expected.insert(k, v);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ldb(&db, &args);
    }
    let before = support::files_but_logs(&db);
    assert!(
        before.keys().any(|n| n.starts_with("MANIFEST-")),
        "{:?}",
        before.keys()
    );

    let v = blobsnap(
        &store,
        &["backup", "--db", db.to_str().unwrap(), "--name", "old"],
    );
    let marker = v["marker"].as_str().unwrap().to_string();
    assert_eq!(
        support::files_but_logs(&db),
        before,
        "the backup changed the database it backed up"
    );

    let back = tmp.path().join("back");
    blobsnap(
        &store,
        &[
            "restore",
            &marker,
            "--job",
            "manual",
            "--job-id",
            "old",
            "--task",
            "backup",
            "--store",
            "db",
            "--to",
            back.to_str().unwrap(),
        ],
    );
    let scan = |dir: &Path| -> BTreeMap<String, String> {
        ldb(dir, &["scan"])
            .lines()
            .map(|l| {
                let (k, v) = l.split_once(" : ").unwrap_or_else(|| panic!("{l:?}"));
                (k.to_string(), v.to_string())
            })
            .collect()
    };
    assert_eq!(scan(&back), expected, "the restore under RocksDB 7.8");
    // And the application's own database still opens under its RocksDB.
    assert_eq!(scan(&db), expected, "the source under RocksDB 7.8");
}

/// What Samza's own engine writes through the Java `S3BlobStoreManager` (issue 50, route 2):
/// an index of Samza's shape — no `sha256`, no `format-version` — whose blobs sit at
/// content-addressed keys. blobsnap restores and verifies it (DESIGN §6: each entry takes the
/// SHA-256 its key names), and a blob whose bytes are not the ones its key names is refused
/// as corrupt, naming the file. A sweep refuses the scope its owner record gives to Samza's
/// engine.
#[test]
fn an_index_of_samzas_shape_with_content_addressed_keys_restores_verified() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let scope = store.join("samzajob/1/tasks/Partition%200/stores/counts");
    let files: [(&str, Vec<u8>); 2] = [
        (
            "000007.sst",
            (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect(),
        ),
        (
            "OPTIONS-000005",
            b"[Version]\n  rocksdb_version=7.0.3\n".to_vec(),
        ),
    ];
    let index = |cid: &str, tamper: bool| -> String {
        let mut entries = Vec::new();
        for (i, (name, bytes)) in files.iter().enumerate() {
            let sha = blobsnap::digest::Sha256::of(bytes).to_hex();
            let key = format!("blobs/{cid}/{sha}");
            let path = scope.join(&key);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let mut stored = bytes.clone();
            if tamper && i == 0 {
                stored[0] ^= 1;
            }
            std::fs::write(&path, &stored).unwrap();
            entries.push(serde_json::json!({
                "file-name": name,
                "blobs": [{"blob-id": key, "offset": 0}],
                "file-metadata": {"creation-time-millis": 1, "last-modified-time-millis": 2,
                    "size": bytes.len(), "owner": "", "group": "", "permissions": "rw-r--r--"},
                "checksum": crc32fast::hash(bytes)
            }));
        }
        let json = serde_json::json!({
            "creation-time-millis": 1_764_480_000_000u64,
            "snapshot-metadata": {"checkpoint-id": cid, "job-name": "samzajob", "job-id": "1",
                "task-name": "Partition 0", "store-name": "counts"},
            "dir-index": {"dir-name": "", "files-present": entries, "files-removed": [],
                "sub-dirs-present": [], "sub-dirs-removed": []},
            "prev-snapshot-index-blob-id": null
        });
        let bytes = serde_json::to_vec(&json).unwrap();
        let marker = format!(
            "index/{cid}.{}.json",
            blobsnap::digest::Sha256::of(&bytes).to_hex()
        );
        std::fs::create_dir_all(scope.join("index")).unwrap();
        std::fs::write(scope.join(&marker), bytes).unwrap();
        marker
    };
    let who = [
        "--job",
        "samzajob",
        "--task",
        "Partition 0",
        "--store",
        "counts",
    ];
    let good = index("1764480000000-0", false);
    let to = tmp.path().join("restored");
    let mut args = vec!["restore", good.as_str()];
    args.extend(who);
    args.extend(["--to", to.to_str().unwrap()]);
    blobsnap(&store, &args);
    for (name, bytes) in &files {
        assert_eq!(&std::fs::read(to.join(name)).unwrap(), bytes, "{name}");
    }
    let mut args = vec!["verify", good.as_str()];
    args.extend(who);
    blobsnap(&store, &args);

    // A blob whose bytes are not the ones its key names: refused (exit 4), naming the file.
    let bad = index("1764480000001-0", true);
    let mut args = vec!["restore", bad.as_str()];
    args.extend(who);
    let to = tmp.path().join("refused");
    args.extend(["--to", to.to_str().unwrap()]);
    let out = Command::new(env!("CARGO_BIN_EXE_blobsnap"))
        .arg("--local")
        .arg(&store)
        .args(&args)
        .env("XDG_CACHE_HOME", tmp.path().join("cache"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("000007.sst"), "{err}");

    // The owner record samza-s3 writes names its engine: its commits are Samza's
    // checkpoints, not blobsnap's history, so a sweep refuses the scope (Conflict, exit 6)
    // instead of finding no root and deleting every snapshot.
    std::fs::write(
        store.join("samzajob/1/scope.json"),
        r#"{"deployment-id":"samza-blob-store","job-name":"samzajob","job-id":"1","engine":"samza-blob-store"}"#,
    )
    .unwrap();
    let files_under = |dir: &Path| -> Vec<std::path::PathBuf> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    out.push(p);
                }
            }
        }
        out.sort();
        out
    };
    let before = files_under(&scope);
    let out = Command::new(env!("CARGO_BIN_EXE_blobsnap"))
        .arg("--local")
        .arg(&store)
        .args(["gc", "--job", "samzajob", "--grace-secs", "0", "--force"])
        .env("XDG_CACHE_HOME", tmp.path().join("cache"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(6), "{err}");
    assert!(err.contains("samza-blob-store"), "{err}");
    assert_eq!(files_under(&scope), before, "nothing deleted");

    // A scope whose samza-s3 keeps a history in blobsnap's layout (`"history": "prepared"`):
    // swept as blobsnap's own. A per-store prepared record (samza-s3 writes one at each index's
    // PUT) names the good snapshot: it stays, whole; the tampered one, named by nothing, goes.
    std::fs::write(
        store.join("samzajob/1/scope.json"),
        r#"{"deployment-id":"samza-blob-store","job-name":"samzajob","job-id":"1","engine":"samza-blob-store","history":"prepared"}"#,
    )
    .unwrap();
    let prepared = store.join("samzajob/1/prepared/Partition%200/1764480000000-0.counts.json");
    std::fs::create_dir_all(prepared.parent().unwrap()).unwrap();
    std::fs::write(
        &prepared,
        format!(
            r#"{{"checkpoint-id":"1764480000000-0","input-offsets":{{}},"state-checkpoint-markers":{{"blobsnap.BlobStoreStateBackendFactory":{{"counts":"{good}"}}}},"version":2}}"#
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_blobsnap"))
        .arg("--local")
        .arg(&store)
        .args(["gc", "--job", "samzajob", "--grace-secs", "0", "--force"])
        .env("XDG_CACHE_HOME", tmp.path().join("cache"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let left = files_under(&scope);
    assert!(left.contains(&scope.join(&good)), "{left:?}");
    assert!(!left.contains(&scope.join(&bad)), "{left:?}");
    assert_eq!(left.len(), 3, "the good index and its two blobs: {left:?}");
    let mut args = vec!["verify", good.as_str()];
    args.extend(who);
    blobsnap(&store, &args);
}
