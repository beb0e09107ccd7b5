//! One damaged record never takes a job's history hostage (issue 47, the savepoint records):
//! a record written by a newer version, cut short, edited by hand (a field out of range, a
//! name that is not its key's) or hostile (a time past year 9999) is listed by its key with
//! the reason beside every healthy savepoint, the listing exits non-zero saying "partial",
//! `savepoint rm` removes it (dry run first), and no command panics on any of them.

use std::path::Path;

async fn run(
    store: &Path,
    args: &[&str],
) -> (Option<i32>, serde_json::Value, String, serde_json::Value) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
        .arg("--json")
        .arg("--local")
        .arg(store)
        .args(args)
        .env("XDG_CACHE_HOME", store.join("../cache"))
        .output()
        .await
        .unwrap();
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
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let demo = tmp.path().join("demo");
    let d = demo.to_str().unwrap();
    let (code, _, err, _) = run(
        &store,
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
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    let job = ["--job", "wordcount"];
    for name in [
        "good", "newer", "cut", "renamed", "range", "future", "hostile",
    ] {
        let (code, _, err, _) = run(
            &store,
            &[&["savepoint", "create"][..], &job, &["--name", name]].concat(),
        )
        .await;
        assert_eq!(code, Some(0), "{name}: {err}");
    }
    let dir = store.join("wordcount/1/savepoints");
    let path = |name: &str| {
        let p = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(&format!("{name}."))
            });
        p.unwrap_or_else(|| panic!("no record of {name} in {}", dir.display()))
    };
    let record = |name: &str| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(path(name)).unwrap()).unwrap()
    };
    let write = |name: &str, v: &serde_json::Value| {
        std::fs::write(path(name), serde_json::to_vec(v).unwrap()).unwrap()
    };
    // Damage six of the seven, each a different way.
    let mut v = record("newer");
    v["format"] = 99.into();
    write("newer", &v);
    let bytes = std::fs::read(path("cut")).unwrap();
    std::fs::write(path("cut"), &bytes[..bytes.len() / 2]).unwrap();
    let mut v = record("renamed");
    v["name"] = "good".into();
    write("renamed", &v);
    let mut v = record("range");
    v["created-millis"] = (-5).into();
    write("range", &v);
    let mut v = record("future");
    v["created-millis"] = serde_json::json!(u64::MAX);
    write("future", &v);
    std::fs::write(path("hostile"), b"\xff\xfe[[[[[[[[not utf-8").unwrap();

    let (code, v, err, e) = run(&store, &[&["savepoint", "ls"][..], &job].concat()).await;
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
    let (code, v, err, _) = run(&store, &[&["checkpoints"][..], &job].concat()).await;
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
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
        .arg("--local")
        .arg(&store)
        .args(["savepoint", "ls", "--job", "wordcount"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(4));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("past 9999-12-31"), "{text}");
    assert!(text.contains("renamed  UNREADABLE"), "{text}");
    for name in ["good", "future"] {
        let (code, _, err, _) = run(
            &store,
            &[&["savepoint", "show"][..], &job, &["--name", name]].concat(),
        )
        .await;
        assert_eq!(code, Some(0), "{name}: {err}");
    }
    for name in bad.keys() {
        let (code, _, err, _) = run(
            &store,
            &[&["savepoint", "show"][..], &job, &["--name", name]].concat(),
        )
        .await;
        assert_eq!(code, Some(4), "{name}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // gc and usage fail closed while one is unreadable (a root they cannot read), and say
    // what names the records and what removes one; check lists each as a problem.
    for cmd in [&["gc", "--dry-run"][..], &["usage"][..]] {
        let (code, _, err, _) = run(&store, &[&cmd[..1], &job, &cmd[1..]].concat()).await;
        assert_eq!(code, Some(4), "{cmd:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(
            err.contains("savepoint ls") && err.contains("savepoint rm"),
            "{cmd:?} names the way out: {err}"
        );
    }
    let (code, v, err, _) = run(&store, &[&["check"][..], &job].concat()).await;
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
    let to = tmp.path().join("r");
    for at in ["@99999999999999999", "@18446744073709551615"] {
        let (code, _, err, _) = run(
            &store,
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
        &store,
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
        &store,
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
    assert!(path("renamed").exists(), "a dry run removes nothing");
    for name in bad.keys() {
        let (code, v, err, _) = run(
            &store,
            &[&["savepoint", "rm"][..], &job, &["--name", name]].concat(),
        )
        .await;
        assert_eq!(code, Some(0), "{name}: {err}");
        assert_eq!(v["removed"], *name, "{v}");
    }
    let (code, v, err, _) = run(&store, &[&["savepoint", "ls"][..], &job].concat()).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["partial"], false, "{v}");
    assert_eq!(v["savepoints"].as_array().unwrap().len(), 2, "{v}");
    let (code, _, err, _) = run(&store, &[&["checkpoints"][..], &job].concat()).await;
    assert_eq!(code, Some(0), "{err}");
    let (code, _, err, _) = run(&store, &[&["gc"][..], &job, &["--dry-run"]].concat()).await;
    assert_eq!(
        code,
        Some(0),
        "gc runs again once the damaged records are gone: {err}"
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
/// fails even the HEAD-only check (sizes); once both are mended, every mode is clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_read_data_finds_a_flipped_byte_and_a_short_blob() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let d = tmp.path().join("demo");
    let (code, _, err, _) = run(
        &store,
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
        let store = store.clone();
        async move {
            run(
                &store,
                &[&["check", "--job", "wordcount"][..], extra].concat(),
            )
            .await
        }
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
}
