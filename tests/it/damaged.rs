//! One damaged record never takes a job's history hostage (issue 47), on the local store and
//! on the external S3 server: a savepoint record or a task's checkpoint document written by a
//! newer version, cut short, edited by hand (a field out of range, a name that is not its
//! key's) or hostile (a time past year 9999, bytes that are not UTF-8) is listed by its key
//! with the reason beside every healthy one, the listing exits non-zero saying "partial",
//! `savepoint rm` / `forget --checkpoint` removes it (dry run first), and no command panics on
//! any of them.

use std::path::Path;
use std::sync::Arc;

use blobsnap::blobstore::{BlobKey, BlobStore, PutBody, PutOptions, Scope};
use futures::TryStreamExt as _;

/// Where a damaged-record test runs: the command's store flags and environment, and a raw
/// view of the same keys (the local dir, or the S3 prefix) to damage records with.
struct Target {
    flags: Vec<String>,
    env: Vec<(String, String)>,
    raw: Arc<dyn BlobStore>,
    work: tempfile::TempDir,
    /// The demo's flags this store needs: `--unsafe-no-fencing` on a server that does not
    /// enforce create-only writes (a single Garage node), where the job refuses to run
    /// without it.
    demo_flags: Vec<&'static str>,
}

impl Target {
    fn local() -> Target {
        let work = tempfile::tempdir().unwrap();
        let dir = work.path().join("store");
        Target {
            flags: vec!["--local".into(), dir.display().to_string()],
            env: Vec::new(),
            raw: Arc::new(blobsnap::blobstore::local::LocalStore::new(&dir).unwrap()),
            work,
            demo_flags: Vec::new(),
        }
    }

    /// The S3 server of the external suites (LocalStack in CI), under a prefix of its own.
    async fn external() -> Target {
        let h = crate::support::external().await;
        let crate::support::Kind::S3(s3) = &h.kind else {
            panic!("the external harness is an S3 store")
        };
        let fences = h
            .store
            .capabilities(blobsnap::blobstore::Probe::Never)
            .await
            .unwrap()
            .create_only
            == blobsnap::blobstore::CreateOnly::Atomic;
        let mut config = s3.config().clone();
        config.prefix = h.scope.as_str().to_string();
        let var = |n: &str, d: &str| std::env::var(n).unwrap_or_else(|_| d.to_string());
        let (ak, sk) = (
            var("BLOBSNAP_TEST_S3_ACCESS_KEY", "test"),
            var("BLOBSNAP_TEST_S3_SECRET_KEY", "test"),
        );
        let raw = blobsnap::blobstore::s3::S3Store::connect_with_credentials(
            config.clone(),
            &ak,
            &sk,
            None,
        )
        .await
        .unwrap();
        let mut flags = vec![
            "--bucket".to_string(),
            config.bucket.clone(),
            "--s3-prefix".into(),
            config.prefix.clone(),
        ];
        if let Some(e) = &config.endpoint {
            flags.extend(["--s3-endpoint".into(), e.clone()]);
        }
        if config.path_style {
            flags.push("--s3-path-style".into());
        }
        Target {
            flags,
            env: vec![
                ("AWS_ACCESS_KEY_ID".into(), ak),
                ("AWS_SECRET_ACCESS_KEY".into(), sk),
                (
                    "AWS_REGION".into(),
                    config.region.clone().unwrap_or_else(|| "us-east-1".into()),
                ),
            ],
            raw: Arc::new(raw),
            work: tempfile::tempdir().unwrap(),
            demo_flags: if fences {
                Vec::new()
            } else {
                vec!["--unsafe-no-fencing"]
            },
        }
    }

    fn command(&self) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"));
        c.args(&self.flags)
            .envs(self.env.iter().cloned())
            .env("XDG_CACHE_HOME", self.work.path().join("cache"));
        c
    }

    /// The command's plain-text output.
    async fn text(&self, args: &[&str]) -> std::process::Output {
        self.command().args(args).output().await.unwrap()
    }

    async fn keys(&self, under: &str) -> Vec<String> {
        self.raw
            .list(&Scope::new(under.to_string()).unwrap())
            .map_ok(|m| m.key.as_str().to_string())
            .try_collect()
            .await
            .unwrap()
    }

    async fn read(&self, key: &str) -> Vec<u8> {
        let key = BlobKey::new(key.to_string()).unwrap();
        blobsnap::blobstore::get_bytes(self.raw.as_ref(), &key, 64 << 20)
            .await
            .unwrap()
            .to_vec()
    }

    async fn write(&self, key: &str, bytes: Vec<u8>) {
        let key = BlobKey::new(key.to_string()).unwrap();
        self.raw
            .put(&key, PutBody::Bytes(bytes.into()), PutOptions::default())
            .await
            .unwrap();
    }

    async fn exists(&self, key: &str) -> bool {
        let key = BlobKey::new(key.to_string()).unwrap();
        match self.raw.head(&key).await {
            Ok(_) => true,
            Err(e) if e.kind() == blobsnap::ErrorKind::NotFound => false,
            Err(e) => panic!("head {key}: {e}"),
        }
    }
}

/// The command with `--json`: its exit code, its JSON output, its stderr, and the JSON error
/// on stderr's last line.
async fn run(
    t: &Target,
    args: &[&str],
) -> (Option<i32>, serde_json::Value, String, serde_json::Value) {
    let out = t.command().arg("--json").args(args).output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let err_json = stderr
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or(serde_json::Value::Null);
    (
        out.status.code(),
        serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null),
        stderr,
        err_json,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_savepoint_is_listed_by_its_key_and_removable_and_nothing_panics() {
    damaged_savepoints(&Target::local()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_checkpoint_document_is_listed_by_its_key_and_removed_keeping_its_number() {
    damaged_checkpoints(&Target::local()).await;
}

mod external {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs the external S3 server (scripts/test.sh starts LocalStack)"]
    async fn a_damaged_savepoint_on_s3() {
        damaged_savepoints(&Target::external().await).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs the external S3 server (scripts/test.sh starts LocalStack)"]
    async fn a_damaged_checkpoint_document_on_s3() {
        damaged_checkpoints(&Target::external().await).await;
    }
}

async fn damaged_savepoints(t: &Target) {
    let store = t;
    let demo = t.work.path().join("demo");
    let d = demo.to_str().unwrap();
    let (code, _, err, _) = run(
        store,
        &[
            &[
                "demo",
                "--dir",
                d,
                "--partitions",
                "1",
                "--lines",
                "600",
                "--commit-every",
                "200",
            ][..],
            &t.demo_flags,
        ]
        .concat(),
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    let job = ["--job", "wordcount"];
    for name in [
        "good", "newer", "cut", "renamed", "range", "future", "hostile",
    ] {
        let (code, _, err, _) = run(
            store,
            &[&["savepoint", "create"][..], &job, &["--name", name]].concat(),
        )
        .await;
        assert_eq!(code, Some(0), "{name}: {err}");
    }
    let keys = t.keys("wordcount/1/savepoints/").await;
    let key = |name: &str| -> String {
        keys.iter()
            .find(|k| {
                k.strip_prefix("wordcount/1/savepoints/")
                    .is_some_and(|f| !f.contains('/') && f.starts_with(&format!("{name}.")))
            })
            .unwrap_or_else(|| panic!("no record of {name} in {keys:?}"))
            .clone()
    };
    let record = |name: &str| {
        let k = key(name);
        async move { serde_json::from_slice::<serde_json::Value>(&t.read(&k).await).unwrap() }
    };
    let write = |name: &str, v: serde_json::Value| {
        let k = key(name);
        async move { t.write(&k, serde_json::to_vec(&v).unwrap()).await }
    };
    // Damage six of the seven, each a different way.
    let mut v = record("newer").await;
    v["format"] = 99.into();
    write("newer", v).await;
    let bytes = t.read(&key("cut")).await;
    t.write(&key("cut"), bytes[..bytes.len() / 2].to_vec())
        .await;
    let mut v = record("renamed").await;
    v["name"] = "good".into();
    write("renamed", v).await;
    let mut v = record("range").await;
    v["created-millis"] = (-5).into();
    write("range", v).await;
    let mut v = record("future").await;
    v["created-millis"] = serde_json::json!(u64::MAX);
    write("future", v).await;
    t.write(&key("hostile"), b"\xff\xfe[[[[[[[[not utf-8".to_vec())
        .await;

    let (code, v, err, e) = run(store, &[&["savepoint", "ls"][..], &job].concat()).await;
    assert_eq!(code, Some(4), "a partial listing is an error: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("partial"),
        "{e}"
    );
    assert_eq!(v["partial"], true, "{v}");
    let listed: Vec<&str> = v["savepoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        listed,
        ["future", "good"],
        "every readable one, under its own name: {v}"
    );
    let bad: std::collections::BTreeMap<&str, &str> = v["unreadable"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| (u["name"].as_str().unwrap(), u["reason"].as_str().unwrap()))
        .collect();
    assert_eq!(
        bad.keys().copied().collect::<Vec<_>>(),
        ["cut", "hostile", "newer", "range", "renamed"],
        "{v}"
    );
    assert!(bad["newer"].contains("newer than this blobsnap"), "{v}");
    assert!(bad["cut"].contains("not JSON"), "{v}");
    assert!(bad["hostile"].contains("not JSON"), "{v}");
    assert!(bad["renamed"].contains("its key says"), "{v}");
    assert!(bad["range"].contains("out of range"), "{v}");

    // `checkpoints` lists every retained checkpoint, labelled by the readable savepoints, and
    // names the unreadable ones: partial, exit 4.
    let (code, v, err, _) = run(store, &[&["checkpoints"][..], &job].concat()).await;
    assert_eq!(code, Some(4), "{err}");
    assert!(err.contains("partial"), "{err}");
    assert_eq!(v["partial"], true, "{v}");
    assert_eq!(
        v["unreadable-savepoints"].as_array().unwrap().len(),
        5,
        "{v}"
    );
    let listed = v["tasks"]["Partition 0"].as_array().unwrap();
    assert!(!listed.is_empty(), "{v}");
    assert!(
        listed.iter().any(|l| l["savepoints"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n == "good")),
        "the readable savepoints still label their checkpoint: {v}"
    );

    // The text listing too, and `show` of each: no panic, a classified error for the damaged.
    let out = t.text(&["savepoint", "ls", "--job", "wordcount"]).await;
    assert_eq!(out.status.code(), Some(4));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("past 9999-12-31"), "{text}");
    assert!(text.contains("renamed  UNREADABLE"), "{text}");
    for name in ["good", "future"] {
        let (code, _, err, _) = run(
            store,
            &[&["savepoint", "show"][..], &job, &["--name", name]].concat(),
        )
        .await;
        assert_eq!(code, Some(0), "{name}: {err}");
    }
    for name in bad.keys() {
        let (code, _, err, _) = run(
            store,
            &[&["savepoint", "show"][..], &job, &["--name", name]].concat(),
        )
        .await;
        assert_eq!(code, Some(4), "{name}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // gc and usage fail closed while one is unreadable (a root they cannot read), and say
    // what names the records and what removes one; check lists each as a problem.
    for cmd in [&["gc", "--dry-run"][..], &["usage"][..]] {
        let (code, _, err, _) = run(store, &[&cmd[..1], &job, &cmd[1..]].concat()).await;
        assert_eq!(code, Some(4), "{cmd:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(
            err.contains("savepoint ls") && err.contains("savepoint rm"),
            "{cmd:?} names the way out: {err}"
        );
    }
    let (code, v, err, _) = run(store, &[&["check"][..], &job].concat()).await;
    assert_eq!(code, Some(4), "{err}");
    let problems = v["report"]["problems"].as_array().unwrap();
    for name in bad.keys() {
        assert!(
            problems.iter().any(|p| p["message"]
                .as_str()
                .unwrap()
                .contains(&format!("savepoint {name:?}"))),
            "check names {name}: {v}"
        );
    }

    // A typed reference past year 9999 is an error, never a panic (issue 46, S4-4).
    let to = t.work.path().join("r");
    for at in ["@99999999999999999", "@18446744073709551615"] {
        let (code, _, err, _) = run(
            store,
            &[
                "restore",
                "--job",
                "wordcount",
                "--task",
                "Partition 0",
                "--store",
                "counts",
                at,
                "--to",
                to.to_str().unwrap(),
            ],
        )
        .await;
        assert!(
            matches!(code, Some(0) | Some(3) | Some(5)),
            "{at}: {code:?} {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }

    let (code, _, err, _) = run(
        store,
        &[
            "savepoint",
            "create",
            "--job",
            "nojob",
            "--name",
            "x",
            "--at",
            "@99999999999999999",
        ],
    )
    .await;
    assert_eq!(code, Some(3), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    // rm: a dry run names it and removes nothing; then each goes.
    let (code, v, err, _) = run(
        store,
        &[
            &["savepoint", "rm"][..],
            &job,
            &["--name", "renamed", "--dry-run"],
        ]
        .concat(),
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["dry-run"], true, "{v}");
    assert!(
        v["unreadable"]["reason"]
            .as_str()
            .unwrap()
            .contains("its key says"),
        "{v}"
    );
    assert!(t.exists(&key("renamed")).await, "a dry run removes nothing");
    for name in bad.keys() {
        let (code, v, err, _) = run(
            store,
            &[&["savepoint", "rm"][..], &job, &["--name", name]].concat(),
        )
        .await;
        assert_eq!(code, Some(0), "{name}: {err}");
        assert_eq!(v["removed"], *name, "{v}");
    }
    let (code, v, err, _) = run(store, &[&["savepoint", "ls"][..], &job].concat()).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["partial"], false, "{v}");
    assert_eq!(v["savepoints"].as_array().unwrap().len(), 2, "{v}");
    let (code, _, err, _) = run(store, &[&["checkpoints"][..], &job].concat()).await;
    assert_eq!(code, Some(0), "{err}");
    let (code, _, err, _) = run(store, &[&["gc"][..], &job, &["--dry-run"]].concat()).await;
    assert_eq!(
        code,
        Some(0),
        "gc runs again once the damaged records are gone: {err}"
    );

    // A fork's pin beside no savepoint record (an interrupted `savepoint rm`): gc fails closed
    // naming `savepoint unpin`, which (the fork wordcount/9 retaining nothing) removes it.
    let pin = blobsnap::layout::JobScope::new("wordcount", "1")
        .unwrap()
        .fork_pin_key("gone", "wordcount", "9", "Partition 0")
        .unwrap();
    t.write(pin.as_str(), b"{}".to_vec()).await;
    let (code, _, err, _) = run(store, &[&["gc"][..], &job, &["--dry-run"]].concat()).await;
    assert_eq!(code, Some(6), "{err}");
    assert!(
        err.contains("which has no record") && err.contains("savepoint unpin"),
        "{err}"
    );
    let unpin = |extra: &'static [&'static str]| async move {
        run(
            store,
            &[
                &["savepoint", "unpin"][..],
                &job,
                &["--name", "gone", "--fork", "wordcount/9"],
                extra,
            ]
            .concat(),
        )
        .await
    };
    let (code, v, err, _) = unpin(&["--dry-run"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["unpinned"]["removed"].as_array().unwrap().len(), 1, "{v}");
    assert!(t.exists(pin.as_str()).await, "a dry run removes nothing");
    let (code, v, err, _) = unpin(&[]).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["unpinned"]["removed"].as_array().unwrap().len(), 1, "{v}");
    assert!(!t.exists(pin.as_str()).await);
    let (code, _, err, _) = unpin(&[]).await;
    assert_eq!(code, Some(3), "no pin left: {err}");
    let (code, _, err, _) = run(store, &[&["gc"][..], &job, &["--dry-run"]].concat()).await;
    assert_eq!(code, Some(0), "{err}");
}

/// Two checkpoint documents of a task damaged (the newest, of a newer format; the one before,
/// cut short): `checkpoints` lists the others and names both by key, exit 4 "partial"; gc
/// fails closed naming the way out, `check` names each key; `forget --checkpoint` refuses a
/// readable one and a key that is not a checkpoint's, removes nothing on a dry run, then
/// replaces each by its removal (again: already removed); the listing shows them `removed`,
/// gc runs; the job restarts from the newest readable checkpoint (its offsets: it processes
/// exactly the lines after it) and commits past the removed numbers, never under one.
async fn damaged_checkpoints(t: &Target) {
    let demo = t.work.path().join("demo");
    let d = demo.to_str().unwrap();
    let run_demo = |lines: &'static str| async move {
        run(
            t,
            &[
                &[
                    "demo",
                    "--dir",
                    d,
                    "--partitions",
                    "1",
                    "--lines",
                    lines,
                    "--commit-every",
                    "100",
                    "--retention",
                    "6",
                ][..],
                &t.demo_flags,
            ]
            .concat(),
        )
        .await
    };
    let (code, _, err, _) = run_demo("400").await;
    assert_eq!(code, Some(0), "{err}");
    let job = ["--job", "wordcount"];
    let (code, v, err, _) = run(t, &[&["checkpoints"][..], &job].concat()).await;
    assert_eq!(code, Some(0), "{err}");
    let listed = |v: &serde_json::Value| -> Vec<(u64, String)> {
        v["tasks"]["Partition 0"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                let offsets = &l["input-offsets"];
                let off = offsets
                    .as_object()
                    .and_then(|o| o.values().next())
                    .and_then(|x| x.as_str())
                    .unwrap_or("")
                    .to_string();
                (l["seq"].as_u64().unwrap(), off)
            })
            .collect()
    };
    let before = listed(&v);
    assert!(before.len() >= 3, "{v}");
    let (newest, second, third) = (before[0].0, before[1].0, before[2].clone());
    let keys = t.keys("wordcount/1/checkpoints/").await;
    let key_of = |seq: u64| -> String {
        keys.iter()
            .find(|k| k.ends_with(&format!("{seq:020}.json")))
            .unwrap_or_else(|| panic!("no document #{seq} in {keys:?}"))
            .clone()
    };
    let (k_newest, k_second) = (key_of(newest), key_of(second));
    let mut doc: serde_json::Value = serde_json::from_slice(&t.read(&k_newest).await).unwrap();
    doc["blobsnap-checkpoint"] = 99.into();
    t.write(&k_newest, serde_json::to_vec(&doc).unwrap()).await;
    let bytes = t.read(&k_second).await;
    t.write(&k_second, bytes[..bytes.len() / 2].to_vec()).await;
    let damaged_second = t.read(&k_second).await;

    // The listing: every readable one, each damaged one by its key with why; partial.
    let (code, v, err, e) = run(t, &[&["checkpoints"][..], &job].concat()).await;
    assert_eq!(code, Some(4), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let message = e["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("partial") && message.contains("forget --checkpoint"),
        "{e}"
    );
    assert_eq!(v["partial"], true, "{v}");
    assert_eq!(
        listed(&v),
        before[2..].to_vec(),
        "the others, unchanged: {v}"
    );
    let bad: std::collections::BTreeMap<u64, (String, String)> = v["unreadable-checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| {
            (
                u["seq"].as_u64().unwrap(),
                (
                    u["key"].as_str().unwrap().to_string(),
                    u["reason"].as_str().unwrap().to_string(),
                ),
            )
        })
        .collect();
    assert_eq!(
        bad.keys().copied().collect::<Vec<_>>(),
        [second, newest],
        "{v}"
    );
    assert_eq!(bad[&newest].0, k_newest, "{v}");
    assert!(bad[&newest].1.contains("format 99"), "{v}");
    assert_eq!(bad[&second].0, k_second, "{v}");
    let out = t.text(&["checkpoints", "--job", "wordcount"]).await;
    assert_eq!(out.status.code(), Some(4));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("#{newest} UNREADABLE")) && text.contains(&k_second),
        "{text}"
    );

    // gc and usage fail closed and say what names them and what removes one; check names
    // each key.
    for cmd in [&["gc", "--dry-run"][..], &["usage"][..]] {
        let (code, _, err, _) = run(t, &[&cmd[..1], &job, &cmd[1..]].concat()).await;
        assert_eq!(code, Some(4), "{cmd:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(
            err.contains("blobsnap checkpoints") && err.contains("forget --checkpoint"),
            "{cmd:?} names the way out: {err}"
        );
    }
    let (code, v, err, _) = run(t, &[&["check"][..], &job].concat()).await;
    assert_eq!(code, Some(4), "{err}");
    let problems = v["report"]["problems"].as_array().unwrap();
    for k in [&k_newest, &k_second] {
        assert!(
            problems.iter().any(|p| p["message"]
                .as_str()
                .unwrap()
                .contains(&format!("forget --checkpoint {k}"))),
            "check names {k}: {v}"
        );
    }
    // A restart before the removal fails closed too (the newest cannot be read).
    let (code, _, err, _) = run_demo("500").await;
    assert_eq!(code, Some(4), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    // forget --checkpoint: the newest readable one (no readable one is newer: it is what the
    // task would restore) and a key that is not a checkpoint's are refused.
    let k_third = key_of(third.0);
    let (code, _, err, _) = run(t, &["forget", "--checkpoint", &k_third]).await;
    assert_eq!(code, Some(5), "{err}");
    assert!(err.contains("newest the task can restore"), "{err}");
    let (code, _, err, _) = run(
        t,
        &["forget", "--checkpoint", "wordcount/1/savepoints/x.json"],
    )
    .await;
    assert_eq!(code, Some(5), "{err}");
    assert!(
        err.contains("not the key of a checkpoint document"),
        "{err}"
    );
    // A document a newer blobsnap wrote is not removed: upgrade instead.
    let (code, _, err, _) = run(t, &["forget", "--checkpoint", &k_newest]).await;
    assert_eq!(code, Some(5), "{err}");
    assert!(err.contains("newer blobsnap"), "{err}");
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&t.read(&k_newest).await).unwrap()
            ["blobsnap-checkpoint"],
        99,
        "left as it was"
    );
    // Damaged by hand instead (a field out of range): removable.
    doc["blobsnap-checkpoint"] = 1.into();
    doc["checkpoint"]["checkpoint-id"] = "not-an-id".into();
    t.write(&k_newest, serde_json::to_vec(&doc).unwrap()).await;
    // A dry run names it and writes nothing.
    let (code, v, err, _) = run(t, &["forget", "--checkpoint", &k_second, "--dry-run"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["dry-run"], true, "{v}");
    assert_eq!(v["removed-checkpoint"]["seq"], second, "{v}");
    assert_eq!(
        t.read(&k_second).await,
        damaged_second,
        "a dry run writes nothing"
    );
    // Each goes; a second time it was already removed.
    for (k, seq) in [(&k_second, second), (&k_newest, newest)] {
        let (code, v, err, _) = run(t, &["forget", "--checkpoint", k]).await;
        assert_eq!(code, Some(0), "{err}");
        assert_eq!(v["removed-checkpoint"]["changed"], true, "{v}");
        assert_eq!(v["removed-checkpoint"]["seq"], seq, "{v}");
        assert!(t.exists(k).await, "the number stays taken: {k}");
    }
    let (code, v, err, _) = run(t, &["forget", "--checkpoint", &k_newest]).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["removed-checkpoint"]["changed"], false, "{v}");
    assert!(
        v["removed-checkpoint"]["reason"]
            .as_str()
            .unwrap()
            .contains("not-an-id"),
        "{v}"
    );
    let (code, v, err, _) = run(t, &[&["checkpoints"][..], &job].concat()).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["partial"], false, "{v}");
    let removed: Vec<u64> = v["removed-checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(removed, [newest, second], "{v}");
    assert_eq!(listed(&v), before[2..].to_vec(), "{v}");
    let (code, _, err, _) = run(t, &[&["gc"][..], &job, &["--dry-run"]].concat()).await;
    assert_eq!(code, Some(0), "gc runs again: {err}");

    // The job restarts from the newest readable checkpoint, by its offsets: it processes
    // exactly the lines after it, and its check holds; what it commits is numbered past the
    // removed documents.
    // (The task's first claim carries no offset: it starts from the beginning.)
    let resumed_at: u64 = if third.1.is_empty() {
        0
    } else {
        third.1.parse().expect("an offset")
    };
    let (code, v, err, _) = run_demo("500").await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["check"], "ok", "{v}");
    assert_eq!(
        v["tasks"][0]["resumed-from"].as_u64(),
        Some(resumed_at),
        "resumed from the newest readable checkpoint: {v}"
    );
    let (code, v, err, _) = run(t, &[&["checkpoints"][..], &job].concat()).await;
    assert_eq!(code, Some(0), "{err}");
    let after = listed(&v);
    assert!(
        after[0].0 > newest,
        "the restart commits past the removed numbers: {after:?}, removed #{newest}"
    );
    assert!(
        after
            .iter()
            .all(|(seq, _)| *seq != newest && *seq != second),
        "no checkpoint under a removed number: {after:?}"
    );
}

/// Every file under `dir` whose path has a `blobs` component, largest first.
fn blob_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.components().any(|c| c.as_os_str() == "blobs") {
                out.push(p);
            }
        }
    }
    out.sort_by_key(|p| std::cmp::Reverse(std::fs::metadata(p).unwrap().len()));
    out
}

/// `check --read-data` against a corrupt blob (issue 46, item 13): a blob with one byte
/// flipped (its size unchanged) passes the HEAD-only check and fails `--read-data` and
/// `--read-data-subset 100%` with exit 4 naming the blob and its hashes; a blob cut short
/// fails even the HEAD-only check (sizes); once both are mended, every mode is clean. A
/// missing blob is not found (exit 3), its key named once, gc's part told as it is for a
/// missing blob (issue 51's runbook walk).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_read_data_finds_a_flipped_byte_and_a_short_blob() {
    let t = Target::local();
    let store = t.work.path().join("store");
    let d = t.work.path().join("demo");
    let (code, _, err, _) = run(
        &t,
        &[
            "demo",
            "--dir",
            d.to_str().unwrap(),
            "--partitions",
            "1",
            "--lines",
            "3000",
            "--commit-every",
            "1000",
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    let blobs = blob_files(&store);
    assert!(blobs.len() >= 2, "{blobs:?}");
    let check = |extra: &'static [&'static str]| {
        let t = &t;
        async move { run(t, &[&["check", "--job", "wordcount"][..], extra].concat()).await }
    };
    for mode in [
        &[][..],
        &["--read-data"][..],
        &["--read-data-subset", "100%"][..],
    ] {
        let (code, v, err, _) = check(mode).await;
        assert_eq!(code, Some(0), "{mode:?} on a sound job: {err}");
        assert_eq!(v["report"]["problems"].as_array().unwrap().len(), 0, "{v}");
    }
    let flipped = &blobs[0];
    let original = std::fs::read(flipped).unwrap();
    let mut bad = original.clone();
    bad[original.len() / 2] ^= 0x40;
    std::fs::write(flipped, &bad).unwrap();
    let name = flipped.file_name().unwrap().to_string_lossy().into_owned();

    let (code, _, err, _) = check(&[]).await;
    assert_eq!(code, Some(0), "HEAD alone cannot see a flipped byte: {err}");
    for mode in [&["--read-data"][..], &["--read-data-subset", "100%"][..]] {
        let (code, v, err, e) = check(mode).await;
        assert_eq!(code, Some(4), "{mode:?}: {err}");
        assert_eq!(e["error"]["kind"], "corrupt", "{e}");
        let problems = v["report"]["problems"].as_array().unwrap();
        assert!(
            problems.iter().any(|p| {
                let m = p["message"].as_str().unwrap();
                p["kind"] == "corrupt" && m.contains(&name) && m.contains("SHA-256")
            }),
            "{mode:?} names the blob and its hash: {v}"
        );
        assert!(v["report"]["blobs-read"].as_u64().unwrap() >= 1, "{v}");
    }
    std::fs::write(flipped, &original).unwrap();

    let short = &blobs[1];
    let original = std::fs::read(short).unwrap();
    std::fs::write(short, &original[..original.len() - 1]).unwrap();
    let name = short.file_name().unwrap().to_string_lossy().into_owned();
    let (code, v, err, _) = check(&[]).await;
    assert_eq!(code, Some(4), "a size mismatch is seen by HEAD: {err}");
    assert!(
        v["report"]["problems"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["message"].as_str().unwrap().contains(&name)
                && p["message"].as_str().unwrap().contains("the index says")),
        "{v}"
    );
    std::fs::write(short, &original).unwrap();
    let (code, _, err, _) = check(&["--read-data"]).await;
    assert_eq!(code, Some(0), "mended: {err}");

    // A missing blob: not found, its key named once, and gc's part told as it is for a
    // missing blob (nothing brings it back), not as for a corrupt one.
    let gone = &blobs[0];
    let original = std::fs::read(gone).unwrap();
    std::fs::remove_file(gone).unwrap();
    let name = gone.file_name().unwrap().to_string_lossy().into_owned();
    let (code, v, err, _) = check(&[]).await;
    assert_eq!(code, Some(3), "{err}");
    let problems = v["report"]["problems"].as_array().unwrap();
    let p = problems
        .iter()
        .find(|p| p["message"].as_str().unwrap().contains(&name))
        .unwrap_or_else(|| panic!("names the missing blob: {v}"));
    let message = p["message"].as_str().unwrap();
    assert_eq!(p["kind"], "not-found", "{v}");
    assert_eq!(message.matches(name.as_str()).count(), 1, "{message}");
    assert!(message.ends_with("is missing"), "{message}");
    let gc = p["gc"].as_str().unwrap();
    assert!(
        gc.contains("nothing can bring it back") && !gc.contains("corrupt"),
        "{gc}"
    );
    std::fs::write(gone, &original).unwrap();
}

/// `check --read-data` against a corrupt blob that several checkpoints share (issue 51, item
/// 1): the problem names every retained checkpoint whose snapshot lists the blob — the
/// task's latest among them, said to be what its next start restores — and the savepoint
/// that pins one of them, not only the first snapshot read; and it says what gc does, which
/// for a bad blob is not to fail closed (a dry run of gc still plans, exit 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_every_checkpoint_and_savepoint_that_needs_a_corrupt_shared_blob() {
    let t = Target::local();
    let store = t.work.path().join("store");
    let d = t.work.path().join("demo");
    let (code, _, err, _) = run(
        &t,
        &[
            "demo",
            "--dir",
            d.to_str().unwrap(),
            "--partitions",
            "1",
            "--lines",
            "6000",
            "--commit-every",
            "500",
            "--retention",
            "4",
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    let job = ["--job", "wordcount"];
    let (code, _, err, _) = run(
        &t,
        &[&["savepoint", "create", "--name", "sp"][..], &job].concat(),
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    let (code, v, err, _) = run(&t, &[&["checkpoints"][..], &job].concat()).await;
    assert_eq!(code, Some(0), "{err}");
    let seqs: Vec<u64> = v["tasks"]["Partition 0"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| !r["stores"].as_object().unwrap().is_empty())
        .map(|r| r["seq"].as_u64().unwrap())
        .collect();
    let latest = seqs[0];
    // Which retained checkpoints list each blob (by its file name, the blob's SHA-256).
    let mut named: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
    for seq in &seqs {
        let r = format!("#{seq}");
        let (code, v, err, _) = run(
            &t,
            &[
                &["inspect"][..],
                &job,
                &["--task", "Partition 0", "--store", "counts", &r],
            ]
            .concat(),
        )
        .await;
        assert_eq!(code, Some(0), "{r}: {err}");
        for f in v["files"].as_array().unwrap() {
            if let Some(b) = f["blob"].as_str() {
                let sha = b.rsplit('/').next().unwrap().to_string();
                named.entry(sha).or_default().push(*seq);
            }
        }
    }
    // The blob the most checkpoints share, the latest among them.
    let (sha, by) = named
        .iter()
        .filter(|(_, by)| by.contains(&latest))
        .max_by_key(|(_, by)| by.len())
        .map(|(s, b)| (s.clone(), b.clone()))
        .unwrap();
    assert!(
        by.len() >= 2,
        "a blob shared by several checkpoints: {named:?}"
    );
    let file = blob_files(&store)
        .into_iter()
        .find(|p| p.file_name().unwrap().to_string_lossy() == sha)
        .unwrap();
    let mut bytes = std::fs::read(&file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&file, &bytes).unwrap();

    let (code, v, err, e) = run(&t, &[&["check", "--read-data"][..], &job].concat()).await;
    assert_eq!(code, Some(4), "{err}");
    assert_eq!(e["error"]["kind"], "corrupt", "{e}");
    let problems = v["report"]["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 1, "one blob, one problem: {v}");
    let p = &problems[0];
    assert!(p["message"].as_str().unwrap().contains(&sha), "{v}");
    let lines: Vec<&str> = p["named-by"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_str().unwrap())
        .collect();
    for seq in &by {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&format!("task \"Partition 0\" checkpoint #{seq} "))),
            "checkpoint #{seq} lists the blob, so it is named: {lines:#?}"
        );
    }
    assert_eq!(
        lines.len(),
        by.len() + 1,
        "each checkpoint once, and the savepoint: {lines:#?}"
    );
    let newest = lines
        .iter()
        .find(|l| l.contains(&format!("#{latest} ")))
        .unwrap();
    assert!(
        newest.contains("the task's latest checkpoint") && newest.contains("next start"),
        "{newest}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("savepoint sp ")),
        "the savepoint at the latest needs it too: {lines:#?}"
    );
    // Truthful about gc: a bad blob does not stop it.
    assert!(
        lines.iter().all(|l| !l.contains("fails closed")),
        "{lines:#?}"
    );
    let gc = p["gc"].as_str().unwrap();
    assert!(
        gc.contains("not stopped") && !gc.contains("fail closed"),
        "{gc}"
    );
    let (code, _, err, _) = run(&t, &[&["gc", "--dry-run"][..], &job].concat()).await;
    assert_eq!(
        code,
        Some(0),
        "gc does not fail closed on a bad blob: {err}"
    );
    // The text says the same.
    let out = t
        .text(&[&["check", "--read-data"][..], &job].concat())
        .await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("checkpoint #{latest} ")) && text.contains("gc: gc is not stopped"),
        "{text}"
    );
}
