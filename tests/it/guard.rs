//! A restore never destroys what it restores from (issue 48): `restore --to` the local store's
//! root, a dir holding it, a dir inside it, a symlink into it, the home, the current dir, a
//! store dir a task holds — each refused whatever the flags, every file of the store
//! unchanged; `--force` only for what looks like a store, `--replace-any-dir` for the rest,
//! and the plan says what it deletes; the demo and `backup --db` keep the same rules.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use blobsnap::local::rocks::RocksStore;
use sha2::{Digest, Sha256};

/// Every file under `dir` (recursively) with the SHA-256 of its bytes.
fn checksums(dir: &Path) -> BTreeMap<PathBuf, [u8; 32]> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() {
                let bytes = std::fs::read(e.path()).unwrap();
                out.insert(
                    e.path().strip_prefix(dir).unwrap().to_path_buf(),
                    Sha256::digest(&bytes).into(),
                );
            }
        }
    }
    out
}

struct Cli {
    store: PathBuf,
    home: PathBuf,
    cache: tempfile::TempDir,
}

impl Cli {
    /// Run the command with `--json --local <store>` in `cwd`; (exit code, stdout JSON, stderr).
    async fn run(&self, cwd: &Path, args: &[&str]) -> (Option<i32>, serde_json::Value, String) {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
            .arg("--json")
            .arg("--local")
            .arg(&self.store)
            .args(args)
            .current_dir(cwd)
            .env("HOME", &self.home)
            .env("XDG_CACHE_HOME", self.cache.path())
            .output()
            .await
            .unwrap();
        (
            out.status.code(),
            serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    async fn restore(
        &self,
        cwd: &Path,
        to: &Path,
        extra: &[&str],
    ) -> (Option<i32>, serde_json::Value, String) {
        let to = to.to_str().unwrap();
        let args = [&["restore", "--name", "nightly", "--to", to][..], extra].concat();
        self.run(cwd, &args).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_never_replaces_its_store_a_home_the_current_dir_or_a_held_store() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let demo = root.join("demo");
    let cli = Cli {
        store: demo.join("store"),
        home: root.join("home"),
        cache: tempfile::tempdir().unwrap(),
    };
    std::fs::create_dir_all(cli.home.join("work")).unwrap();
    let db = demo.join("db");
    {
        let rocks = RocksStore::open("x", &db).unwrap();
        for i in 0..2000u32 {
            rocks
                .db()
                .put(format!("key{i:08}"), vec![(i % 251) as u8; 200])
                .unwrap();
        }
    }
    let db_s = db.to_str().unwrap();
    let (code, _, err) = cli
        .run(root, &["backup", "--db", db_s, "--name", "nightly"])
        .await;
    assert_eq!(code, Some(0), "{err}");
    let before = checksums(&cli.store);
    assert!(before.len() >= 3, "{before:?}");
    std::fs::create_dir_all(cli.store.join("jobs-extra")).unwrap();
    std::os::unix::fs::symlink(&cli.store, root.join("link")).unwrap();

    let all = ["--force", "--replace-any-dir"];
    let refused: [(PathBuf, &Path, &str); 8] = [
        (cli.store.clone(), root, "is the local blob store in use"),
        (demo.clone(), root, "contains the local blob store in use"),
        (
            cli.store.join("jobs-extra"),
            root,
            "lies inside the local blob store in use",
        ),
        (
            cli.store.join("new/deeper"),
            root,
            "lies inside the local blob store in use",
        ),
        (
            root.join("link/x"),
            root,
            "lies inside the local blob store",
        ),
        (cli.home.clone(), root, "is the home directory"),
        (
            cli.home.join("work"),
            &cli.home.join("work"),
            "current directory",
        ),
        (cli.home.clone(), &cli.home.join("work"), "home directory"),
    ];
    for (to, cwd, why) in &refused {
        let (code, _, err) = cli.restore(cwd, to, &all).await;
        assert_eq!(code, Some(5), "--to {to:?} from {cwd:?}: {err}");
        assert!(err.contains(why), "--to {to:?}: {err}");
        assert!(err.contains("nothing changed"), "{err}");
        assert_eq!(
            checksums(&cli.store),
            before,
            "a refused restore into {to:?} changed the store"
        );
    }
    // The current dir as `.`, and `/`.
    let work = cli.home.join("work");
    let (code, _, err) = cli.restore(&work, Path::new("."), &all).await;
    assert_eq!(code, Some(5), "{err}");
    let (code, _, err) = cli.restore(root, Path::new("/"), &all).await;
    assert_eq!(code, Some(5), "{err}");
    assert!(err.contains("root directory"), "{err}");
    assert!(work.is_dir() && cli.home.is_dir());

    // A store dir a task holds, and a dir that holds one: a conflict (exit 6).
    let held = root.join("state/p0/counts");
    std::fs::create_dir_all(&held).unwrap();
    let lock = blobsnap::local::lock::StoreDirLock::acquire(&held).unwrap();
    for to in [root.join("state"), held.clone(), held.join("sub")] {
        let (code, _, err) = cli.restore(root, &to, &all).await;
        assert_eq!(code, Some(6), "--to {to:?}: {err}");
        // The holder is named as it wrote itself into the lock file: this test's process.
        assert!(
            err.contains(&format!("that pid {} (", std::process::id())),
            "{err}"
        );
    }
    drop(lock);

    // A non-store dir: refused with --force, its plan (a dry run) names what would go, then
    // replaced with --replace-any-dir.
    let mine = root.join("mine");
    std::fs::create_dir_all(mine.join("src/deep")).unwrap();
    std::fs::create_dir_all(mine.join("docs")).unwrap();
    std::fs::write(mine.join("README"), b"0123456789").unwrap();
    std::fs::write(mine.join("src/a.rs"), vec![1u8; 1000]).unwrap();
    std::fs::write(mine.join("src/deep/b.rs"), vec![2u8; 500]).unwrap();
    std::fs::write(mine.join("docs/c.md"), vec![3u8; 100]).unwrap();
    let mine_before = checksums(&mine);
    let (code, _, err) = cli.restore(root, &mine, &["--force"]).await;
    assert_eq!(code, Some(5), "{err}");
    assert!(err.contains("--replace-any-dir"), "{err}");
    assert!(err.contains("4 files, 1610 bytes"), "{err}");
    assert!(err.contains("src/ (2 files, 1500 bytes)"), "{err}");
    assert_eq!(checksums(&mine), mine_before);
    let (code, v, err) = cli
        .restore(root, &mine, &["--replace-any-dir", "--dry-run"])
        .await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["replaces"]["files"], 4, "{v}");
    assert_eq!(v["replaces"]["bytes"], 1610, "{v}");
    assert_eq!(v["replaces"]["largest-subdirs"][0]["name"], "src", "{v}");
    assert_eq!(v["replaces"]["largest-subdirs"][0]["bytes"], 1500, "{v}");
    assert_eq!(v["replaces"]["largest-subdirs"][1]["name"], "docs", "{v}");
    assert_eq!(checksums(&mine), mine_before, "a dry run deletes nothing");
    let (code, v, err) = cli.restore(root, &mine, &["--replace-any-dir"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["replaces"]["files"], 4, "{v}");
    assert!(mine.join("RESTORED").is_file() && !mine.join("src").exists());
    assert_eq!(
        RocksStore::open("check", &mine)
            .unwrap()
            .db()
            .iterator(rocksdb::IteratorMode::Start)
            .count(),
        2000
    );
    assert_eq!(checksums(&cli.store), before);

    // `backup --db` never writes into its source: a local store inside the database is refused.
    let inner = Cli {
        store: db.join("store"),
        home: cli.home.clone(),
        cache: tempfile::tempdir().unwrap(),
    };
    let (code, _, err) = inner
        .run(root, &["backup", "--db", db_s, "--name", "n"])
        .await;
    assert_eq!(code, Some(5), "{err}");
    assert!(
        err.contains("--db") && err.contains("contains the local blob store"),
        "{err}"
    );
    assert!(!db.join("store").exists());

    // The demo's state dir may not be its store.
    let state_store = Cli {
        store: root.join("d2/state"),
        home: cli.home.clone(),
        cache: tempfile::tempdir().unwrap(),
    };
    std::fs::create_dir_all(&state_store.store).unwrap();
    let d2 = root.join("d2");
    let (code, _, err) = state_store
        .run(
            root,
            &["demo", "--dir", d2.to_str().unwrap(), "--lines", "100"],
        )
        .await;
    assert_eq!(code, Some(5), "{err}");
    assert!(err.contains("is the local blob store"), "{err}");
    assert!(!d2.join("input").exists(), "the refused demo wrote nothing");
}
