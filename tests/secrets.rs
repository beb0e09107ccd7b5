//! Credentials never leak: the access key id, the secret key and the session token appear in
//! no log line (every target, at trace level, the AWS SDK's included, written through
//! `blobsnap::redact::RedactingWriter` as the CLI does), no error message, no `Debug` output of
//! a store or its settings, and nothing the CLI prints (`--json` or not, `RUST_LOG=trace`) in
//! any command that talks to the store (demo, backup, restore, verify, inspect, ls, gc,
//! cost), whether the requests succeed or are refused.

mod support;

use std::io::Write as _;
use std::sync::{Arc, Mutex, OnceLock};

use blobsnap::blobstore::s3::S3Store;
use blobsnap::blobstore::{get_bytes, list_all, BlobKey, BlobStore, PutBody, PutOptions, Scope};
use blobsnap::digest::Sha256;

/// Distinctive values: any appearance of one of them is a leak.
const SECRET_KEY: &str = "s3s-fs-test-secret-key-0123456789";
const TOKEN: &str = "SessionTokenZZ9PluralZAlpha0987654321";
const WRONG_ACCESS: &str = "AKIAWRONGWRONGWRONG1";
const WRONG_SECRET: &str = "wrongSecretKeyDoNotLeak/0123456789abcdef";

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Every event of every target at trace level, into one buffer (a global subscriber: the
/// SDK logs from runtime threads).
fn logs() -> &'static Captured {
    static LOGS: OnceLock<Captured> = OnceLock::new();
    LOGS.get_or_init(|| {
        let c = Captured::default();
        let w = c.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_writer(blobsnap::redact::RedactingWriter::new(move || w.clone()))
            .with_ansi(false)
            .init();
        c
    })
}

fn assert_clean(what: &str, text: &str, secrets: &[&str]) {
    for s in secrets {
        assert!(
            !text.contains(s),
            "{what} contains the credential {s:?}:\n{}",
            text.lines()
                .filter(|l| l.contains(s))
                .take(5)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_appear_in_no_log_error_debug_or_cli_output() {
    let logs = logs();
    let dir = tempfile::tempdir().unwrap();
    let addr = support::start_s3s(dir.path()).await;
    let config = support::s3s_config(addr, "secrets");
    let secrets = [
        support::S3S_ACCESS_KEY,
        SECRET_KEY,
        TOKEN,
        WRONG_ACCESS,
        WRONG_SECRET,
    ];
    assert_eq!(SECRET_KEY, support::S3S_SECRET_KEY);

    // Requests that succeed, at trace level.
    let store = S3Store::connect_with_credentials(
        config.clone(),
        support::S3S_ACCESS_KEY,
        SECRET_KEY,
        None,
    )
    .await
    .unwrap();
    store
        .client()
        .create_bucket()
        .bucket("secrets")
        .send()
        .await
        .unwrap();
    let scope = Scope::new("s/").unwrap();
    let key: BlobKey = scope.key("a").unwrap();
    store
        .put(
            &key,
            PutBody::Bytes(bytes::Bytes::from_static(b"hello")),
            PutOptions::create_only(Sha256::of(b"hello")),
        )
        .await
        .unwrap();
    assert_eq!(&get_bytes(&store, &key, 100).await.unwrap()[..], b"hello");
    assert_eq!(list_all(&store, &scope).await.unwrap().len(), 1);
    let debug = format!("{store:?} {store} {:?} {config:?}", store.config());

    // Requests that are refused: wrong keys, a session token.
    let bad =
        S3Store::connect_with_credentials(config.clone(), WRONG_ACCESS, WRONG_SECRET, Some(TOKEN))
            .await
            .unwrap();
    let e = bad
        .put(
            &key,
            PutBody::Bytes(bytes::Bytes::from_static(b"x")),
            PutOptions::default(),
        )
        .await
        .unwrap_err();
    let e2 = bad.head(&key).await.unwrap_err();
    let e3 = list_all(&bad, &scope).await.unwrap_err();
    let errors = format!("{e} {e:?} {e2} {e2:?} {e3} {e3:?} {bad:?}");
    assert!(
        errors.contains("403")
            || errors.to_lowercase().contains("denied")
            || errors.contains("Signature"),
        "{errors}"
    );

    // Every request above has returned, and the subscriber writes synchronously: what they
    // logged is in the capture. The clients are dropped first; what their pools' background
    // tasks might still log after that is not waited for (no event marks its end).
    drop(bad);
    drop(store);
    let logged = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
    assert!(
        logged.contains("TRACE") && logged.len() > 10_000,
        "trace logging was captured ({} bytes)",
        logged.len()
    );
    assert_clean("the trace-level log", &logged, &secrets);
    assert_clean("the errors", &errors, &secrets);
    assert_clean(
        "Debug/Display of the store and its settings",
        &debug,
        &secrets,
    );

    // The CLI, with credentials in the environment, RUST_LOG=trace, --json and not: every
    // command that talks to the store (the demo job, backup, restore, verify, inspect, ls, gc,
    // cost), with good keys (each succeeds) and with wrong keys and a session token (each is
    // refused).
    let work = tempfile::tempdir().unwrap();
    let db = work.path().join("db");
    {
        let db = blobsnap::local::rocks::RocksStore::open("x", &db).unwrap();
        for i in 0..200u32 {
            db.db().put(format!("k{i}"), b"v").unwrap();
        }
        db.db().flush().unwrap();
    }
    let mut run = 0;
    for json in [true, false] {
        for (ak, sk, token) in [
            (support::S3S_ACCESS_KEY, SECRET_KEY, None),
            (WRONG_ACCESS, WRONG_SECRET, Some(TOKEN)),
        ] {
            run += 1;
            let demo = work.path().join(format!("demo-{run}"));
            let to = work.path().join(format!("restored-{run}"));
            let commands: Vec<Vec<String>> = vec![
                vec![
                    "demo".into(),
                    "--dir".into(),
                    demo.display().to_string(),
                    "--partitions".into(),
                    "1".into(),
                    "--lines".into(),
                    "600".into(),
                    "--commit-every".into(),
                    "200".into(),
                    "--unsafe-no-fencing".into(),
                ],
                vec![
                    "backup".into(),
                    "--db".into(),
                    db.display().to_string(),
                    "--name".into(),
                    "n".into(),
                ],
                vec![
                    "restore".into(),
                    "--name".into(),
                    "n".into(),
                    "--to".into(),
                    to.display().to_string(),
                ],
                vec!["verify".into(), "--name".into(), "n".into()],
                vec!["inspect".into(), "--name".into(), "n".into()],
                vec!["ls".into()],
                vec![
                    "gc".into(),
                    "--job".into(),
                    "wordcount".into(),
                    "--dry-run".into(),
                ],
                vec!["cost".into(), "--job".into(), "wordcount".into()],
            ];
            for command in commands {
                let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"));
                if json {
                    cmd.arg("--json");
                }
                cmd.args([
                    "--bucket",
                    "secrets",
                    "--s3-endpoint",
                    &format!("http://{addr}"),
                    "--s3-region",
                    "us-east-1",
                    "--s3-path-style",
                ])
                .args(&command)
                .env("AWS_ACCESS_KEY_ID", ak)
                .env("AWS_SECRET_ACCESS_KEY", sk)
                .env("RUST_LOG", "trace")
                .env("XDG_CACHE_HOME", work.path().join("cache"))
                .env("BLOBSNAP_S3_CREATE_ONLY", "racy")
                // s3s-fs answers 501 to ListMultipartUploads.
                .env("BLOBSNAP_S3_MULTIPART_LISTING", "false");
                if let Some(t) = token {
                    cmd.env("AWS_SESSION_TOKEN", t);
                }
                let out = cmd.output().unwrap();
                let text = format!(
                    "{}\n{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                assert!(
                    text.contains("TRACE"),
                    "{command:?}: the CLI logged at trace level"
                );
                assert_eq!(
                    out.status.success(),
                    token.is_none(),
                    "{command:?}: good keys succeed, wrong keys are refused: {}",
                    &text[text.len().saturating_sub(2000)..]
                );
                assert_clean(
                    &format!(
                        "the output of {command:?} (json {json}, token {})",
                        token.is_some()
                    ),
                    &text,
                    &secrets,
                );
            }
        }
    }
    let _ = std::io::stderr().flush();
}
