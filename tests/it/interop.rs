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
