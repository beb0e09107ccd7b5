//! The blob backend's admin: create and validate resources, and the clear errors of a missing
//! bucket, bad credentials, a dead endpoint, a scope owned by another deployment, and an
//! expiration rule over the prefix.

use crate::support;

use std::sync::Arc;

use blobsnap::backend::StateBackendAdmin as _;
use blobsnap::blob::admin::BlobStoreAdmin;
use blobsnap::blobstore::retry::{RetryPolicy, RetryStore};
use blobsnap::blobstore::s3::S3Store;
use blobsnap::blobstore::BlobStore;
use blobsnap::blobstore::Probe;
use blobsnap::ErrorKind;

fn job(h: &support::Harness) -> String {
    h.scope.as_str().trim_end_matches('/').to_string()
}

fn admin(h: &support::Harness, deployment: &str) -> BlobStoreAdmin {
    let s3 = match &h.kind {
        support::Kind::S3(s) => Some(s.clone()),
        support::Kind::Local(_) => None,
    };
    BlobStoreAdmin::new(Arc::clone(&h.store), s3, &job(h), "1", deployment).unwrap()
}

async fn create_validate_and_ownership(h: &support::Harness) {
    let a = admin(h, "deploy-a");
    let e = a.validate_resources().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{}: {e}", h.name);
    assert!(e.to_string().contains("blobsnap admin create"), "{e}");
    a.create_resources().await.unwrap();
    a.create_resources().await.unwrap(); // idempotent
    a.validate_resources().await.unwrap();
    let b = admin(h, "deploy-b");
    let e = b.create_resources().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict, "{}: {e}", h.name);
    let e = b.validate_resources().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict);
    assert!(
        e.to_string().contains("deploy-a") && e.to_string().contains("deploy-b"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_create_validate_and_ownership() {
    let h = support::local().await;
    create_validate_and_ownership(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3s_create_validate_and_ownership() {
    let h = support::s3s().await;
    create_validate_and_ownership(&h).await;
    h.cleanup().await;
}

fn quick_retry() -> RetryPolicy {
    RetryPolicy {
        initial_delay_ms: 10,
        max_delay_ms: 50,
        budget_ms: 500,
        max_attempts: 0,
        factor: 2.0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_credentials_and_dead_endpoint_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let addr = support::start_s3s(dir.path()).await;
    let good = S3Store::connect_with_credentials(
        support::s3s_config(addr, "blobsnap-test"),
        support::S3S_ACCESS_KEY,
        support::S3S_SECRET_KEY,
        None,
    )
    .await
    .unwrap();
    good.client()
        .create_bucket()
        .bucket("blobsnap-test")
        .send()
        .await
        .unwrap();
    // Bad credentials: an unknown key, and a known key with the wrong secret.
    for (ak, sk) in [
        ("AKIAUNKNOWNKEY", "whatever-secret"),
        (support::S3S_ACCESS_KEY, "wrong-secret-value"),
    ] {
        let s3 = S3Store::connect_with_credentials(
            support::s3s_config(addr, "blobsnap-test"),
            ak,
            sk,
            None,
        )
        .await
        .unwrap();
        let store: Arc<dyn BlobStore> = Arc::new(RetryStore::new(s3.clone(), quick_retry()));
        let e = BlobStoreAdmin::new(store, Some(s3), "j", "1", "d")
            .unwrap()
            .validate_resources()
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Permanent, "{ak}: {e}");
        assert!(e.to_string().contains("403"), "{ak}: {e}");
        assert!(!e.to_string().contains(sk), "never print secrets: {e}");
    }
    // A dead endpoint: a classified, bounded failure, not a hang.
    let dead: std::net::SocketAddr = "127.0.0.1:9".parse().unwrap();
    let s3 = S3Store::connect_with_credentials(
        support::s3s_config(dead, "blobsnap-test"),
        support::S3S_ACCESS_KEY,
        support::S3S_SECRET_KEY,
        None,
    )
    .await
    .unwrap();
    let store: Arc<dyn BlobStore> = Arc::new(RetryStore::new(s3.clone(), quick_retry()));
    // The outcome is the classified error; the timeout only turns a hang into a failure (the
    // retry budget is 500 ms of backoff, so no machine comes near it).
    let admin = BlobStoreAdmin::new(store, Some(s3), "j", "1", "d").unwrap();
    let e = tokio::time::timeout(
        std::time::Duration::from_secs(300),
        admin.validate_resources(),
    )
    .await
    .expect("a dead endpoint fails, never hangs")
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Transient, "{e}");
    assert!(e.to_string().contains("could not reach"), "{e}");
}

mod external {
    use super::*;

    /// `ca-bundle` against a TLS endpoint (the external server's own TLS port, its certificate
    /// signed by a CA of the test's: BLOBSNAP_TEST_S3_TLS_ENDPOINT / _CA_BUNDLE): with the
    /// bundle (the library setting and the CLI's `BLOBSNAP_S3_CA_BUNDLE`) objects go and come
    /// back; without it the certificate is refused, classified `Permanent` and named; a bundle
    /// that is not PEM is refused at startup naming the file.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs BLOBSNAP_TEST_S3_ENDPOINT; run by scripts/test.sh"]
    async fn ca_bundle_against_a_tls_endpoint() {
        use blobsnap::blobstore::{get_bytes, BlobKey, PutBody, PutOptions};
        let h = support::external().await;
        let set = |v: &str| std::env::var(v).ok().filter(|s| !s.is_empty());
        let (Some(endpoint), Some(ca)) = (
            set("BLOBSNAP_TEST_S3_TLS_ENDPOINT"),
            set("BLOBSNAP_TEST_S3_CA_BUNDLE"),
        ) else {
            assert_ne!(
                set("BLOBSNAP_TEST_S3_SERVER").as_deref(),
                Some("localstack"),
                "minio/localstack.sh env names a TLS endpoint and its CA bundle: they are missing"
            );
            return h.lacks("a TLS endpoint with a CA bundle");
        };
        let support::Kind::S3(s3) = &h.kind else {
            unreachable!()
        };
        let ak = std::env::var("BLOBSNAP_TEST_S3_ACCESS_KEY").unwrap_or_else(|_| "test".into());
        let sk = std::env::var("BLOBSNAP_TEST_S3_SECRET_KEY").unwrap_or_else(|_| "test".into());
        let mut cfg = s3.config().clone();
        cfg.endpoint = Some(endpoint.clone());
        cfg.ca_bundle = Some(ca.clone().into());
        let tls = S3Store::connect_with_credentials(cfg.clone(), &ak, &sk, None)
            .await
            .unwrap();
        let key = BlobKey::new(format!("{}tls/object", h.scope.as_str())).unwrap();
        tls.put(
            &key,
            PutBody::Bytes(b"over TLS".to_vec().into()),
            PutOptions::default(),
        )
        .await
        .unwrap();
        assert_eq!(
            &get_bytes(&tls, &key, 1 << 10).await.unwrap()[..],
            b"over TLS"
        );

        // Without the bundle: the server's certificate is not trusted.
        cfg.ca_bundle = None;
        let untrusted = S3Store::connect_with_credentials(cfg.clone(), &ak, &sk, None)
            .await
            .unwrap();
        let store = RetryStore::new(untrusted, quick_retry());
        let e = get_bytes(&store, &key, 1 << 10).await.unwrap_err();
        eprintln!("TLS without the CA bundle: {e}");
        assert_eq!(e.kind(), ErrorKind::Permanent, "{e}");
        assert!(e.to_string().contains("certificate"), "{e}");

        // A bundle that is not PEM.
        let tmp = tempfile::tempdir().unwrap();
        let junk = tmp.path().join("not-a-bundle.pem");
        std::fs::write(&junk, b"this is not a certificate").unwrap();
        cfg.ca_bundle = Some(junk.clone());
        let e = S3Store::connect_with_credentials(cfg.clone(), &ak, &sk, None)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains("not-a-bundle.pem"), "{e}");

        // The CLI, configured from the environment: a listing over TLS goes through. (Not
        // `probe`: its 64 concurrent create-only PUTs stall LocalStack's TLS listener for
        // minutes; its plain-HTTP port serves them in a second.)
        let run = |bundle: Option<&str>| {
            let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"));
            c.args([
                "--json",
                "--bucket",
                &cfg.bucket,
                "--s3-endpoint",
                &endpoint,
            ])
            .args(["--s3-path-style", "--s3-prefix", h.scope.as_str(), "ls"])
            .env("AWS_ACCESS_KEY_ID", &ak)
            .env("AWS_SECRET_ACCESS_KEY", &sk)
            .env("AWS_REGION", cfg.region.as_deref().unwrap_or("us-east-1"))
            .env_remove("BLOBSNAP_S3_CA_BUNDLE");
            if let Some(b) = bundle {
                c.env("BLOBSNAP_S3_CA_BUNDLE", b);
            }
            c.output().unwrap()
        };
        let out = run(Some(&ca));
        assert!(
            out.status.success(),
            "ls over TLS with the bundle: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = run(None);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(8), "permanent: {err}");
        assert!(err.contains("certificate"), "{err}");
        h.cleanup().await;
    }

    /// Virtual-hosted-style addressing (`path-style = false`, the S3 default): requests go to
    /// `<bucket>.<domain>`. The server's own name (BLOBSNAP_TEST_S3_VHOST_DOMAIN) never
    /// resolves here, so `s3.resolve` maps the bucket's host name to the server; the bare
    /// domain is mapped to another loopback address on which nothing listens at the server's
    /// port ([`dead_loopback`]), so only requests addressed by the bucket's name can reach the
    /// server and a path-style request is refused at once, on this machine. A put, a listing, a
    /// multipart upload and the demo job go through virtual-hosted; the same settings with
    /// path-style cannot connect.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs BLOBSNAP_TEST_S3_ENDPOINT; run by scripts/test.sh"]
    async fn virtual_hosted_addressing_through_fixed_addresses() {
        use blobsnap::blobstore::{get_bytes, BlobKey, PutBody, PutOptions};
        let h = support::external().await;
        let Some(domain) = std::env::var("BLOBSNAP_TEST_S3_VHOST_DOMAIN")
            .ok()
            .filter(|s| !s.is_empty())
        else {
            assert_ne!(
                std::env::var("BLOBSNAP_TEST_S3_SERVER").as_deref(),
                Ok("localstack"),
                "minio/localstack.sh env names the virtual-host domain: it is missing"
            );
            return h.lacks("virtual-hosted addressing (BLOBSNAP_TEST_S3_VHOST_DOMAIN)");
        };
        let support::Kind::S3(s3) = &h.kind else {
            unreachable!()
        };
        let ak = std::env::var("BLOBSNAP_TEST_S3_ACCESS_KEY").unwrap_or_else(|_| "test".into());
        let sk = std::env::var("BLOBSNAP_TEST_S3_SECRET_KEY").unwrap_or_else(|_| "test".into());
        let mut cfg = s3.config().clone();
        let base = cfg.endpoint.clone().expect("an external endpoint");
        let url = split_endpoint(&base);
        let endpoint = format!("{}://{domain}:{}", url.0, url.2);
        let bucket_host = format!("{}.{domain}", cfg.bucket);
        let server_ip: std::net::IpAddr = url.1.parse().expect("the endpoint is an IP address");
        let dead = dead_loopback(server_ip, url.2);
        cfg.endpoint = Some(endpoint.clone());
        cfg.path_style = false;
        cfg.connect_timeout_ms = 500;
        cfg.resolve = [(bucket_host.clone(), server_ip), (domain.clone(), dead)].into();
        cfg.multipart_threshold = 5 << 20;
        cfg.part_size = 5 << 20;
        let vh = S3Store::connect_with_credentials(cfg.clone(), &ak, &sk, None)
            .await
            .unwrap();
        let small = BlobKey::new(format!("{}vh/small", h.scope.as_str())).unwrap();
        vh.put(
            &small,
            PutBody::Bytes(b"virtual-hosted".to_vec().into()),
            PutOptions::default(),
        )
        .await
        .unwrap();
        assert_eq!(
            &get_bytes(&vh, &small, 1 << 10).await.unwrap()[..],
            b"virtual-hosted"
        );
        let tmp = tempfile::tempdir().unwrap();
        let big_path = tmp.path().join("big");
        let big: Vec<u8> = (0..(11u32 << 20)).map(|i| (i % 251) as u8).collect();
        std::fs::write(&big_path, &big).unwrap();
        let big_key = BlobKey::new(format!("{}vh/big", h.scope.as_str())).unwrap();
        vh.put(
            &big_key,
            PutBody::File {
                path: big_path.clone(),
                len: big.len() as u64,
            },
            PutOptions::default(),
        )
        .await
        .unwrap();
        assert_eq!(get_bytes(&vh, &big_key, 32 << 20).await.unwrap(), big);
        let vh_scope = blobsnap::blobstore::Scope::new(format!("{}vh/", h.scope.as_str())).unwrap();
        let listed = blobsnap::blobstore::list_all(&vh, &vh_scope).await.unwrap();
        assert_eq!(listed.len(), 2, "{listed:?}");

        // Path-style with the same map goes to the bare domain: nothing listens there, so the
        // connection is refused.
        let mut path_cfg = cfg.clone();
        path_cfg.path_style = true;
        let path = S3Store::connect_with_credentials(path_cfg, &ak, &sk, None)
            .await
            .unwrap();
        let e = get_bytes(&RetryStore::new(path, quick_retry()), &small, 1 << 10)
            .await
            .unwrap_err();
        assert_eq!(
            e.kind(),
            ErrorKind::Transient,
            "path-style must not reach it: {e}"
        );

        // The CLI, configured from the environment: the demo job commits, restores and
        // checks over virtual-hosted addressing.
        let resolve = format!("{bucket_host}={server_ip},{domain}={dead}");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
            .args([
                "--json",
                "--bucket",
                &cfg.bucket,
                "--s3-endpoint",
                &endpoint,
            ])
            .args([
                "--s3-prefix",
                &format!("{}demo/", h.scope.as_str()),
                "demo",
                "--dir",
            ])
            .arg(tmp.path().join("demo"))
            .args([
                "--partitions",
                "2",
                "--lines",
                "2000",
                "--commit-every",
                "500",
            ])
            .args(
                (h.store
                    .capabilities(Probe::Never)
                    .await
                    .unwrap()
                    .create_only
                    != blobsnap::blobstore::CreateOnly::Atomic)
                    .then_some("--unsafe-no-fencing"),
            )
            .env("BLOBSNAP_S3_RESOLVE", &resolve)
            .env_remove("BLOBSNAP_S3_PATH_STYLE")
            .env("AWS_ACCESS_KEY_ID", &ak)
            .env("AWS_SECRET_ACCESS_KEY", &sk)
            .env("AWS_REGION", cfg.region.as_deref().unwrap_or("us-east-1"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "demo over virtual-hosted addressing: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["check"], "ok", "{v}");
        h.cleanup().await;
    }

    /// A loopback address other than `server` on which nothing listens at `port`: the first
    /// of 127.0.0.2.. that this process can bind `port` on (without SO_REUSEADDR, so a
    /// listener on that address or on 0.0.0.0 makes the bind fail). The socket is closed
    /// again: a connection there is refused by this machine's kernel. Never an address off
    /// this machine (tests/it/loopback_only.rs).
    fn dead_loopback(server: std::net::IpAddr, port: u16) -> std::net::IpAddr {
        (2..=254u8)
            .map(|last| std::net::IpAddr::from([127, 0, 0, last]))
            .filter(|ip| *ip != server)
            .find(|ip| std::net::TcpListener::bind((*ip, port)).is_ok())
            .expect("a loopback address with nothing listening on the server's port")
    }

    /// (scheme, host, port) of an endpoint URL `scheme://host:port`.
    fn split_endpoint(url: &str) -> (String, String, u16) {
        let (scheme, rest) = url.split_once("://").expect("scheme://");
        let rest = rest.trim_end_matches('/');
        let (host, port) = rest.rsplit_once(':').expect("host:port");
        (scheme.into(), host.into(), port.parse().expect("a port"))
    }

    /// The bucket's lifecycle configuration is one document: the tests that rewrite it take
    /// turns (run at once, one replaced the other's rules).
    static LIFECYCLE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs BLOBSNAP_TEST_S3_ENDPOINT; run by scripts/test.sh"]
    async fn missing_bucket_is_clear() {
        let h = support::external().await;
        let support::Kind::S3(s3) = &h.kind else {
            unreachable!()
        };
        let mut cfg = s3.config().clone();
        cfg.bucket = format!("no-such-bucket-{:08x}", rand::random::<u32>());
        let ak = std::env::var("BLOBSNAP_TEST_S3_ACCESS_KEY").unwrap_or_else(|_| "test".into());
        let sk = std::env::var("BLOBSNAP_TEST_S3_SECRET_KEY").unwrap_or_else(|_| "test".into());
        let missing = S3Store::connect_with_credentials(cfg, &ak, &sk, None)
            .await
            .unwrap();
        let store: Arc<dyn BlobStore> = Arc::new(RetryStore::new(missing.clone(), quick_retry()));
        let e = BlobStoreAdmin::new(store, Some(missing), "j", "1", "d")
            .unwrap()
            .validate_resources()
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Permanent, "{e}");
        assert!(e.to_string().contains("does not exist"), "{e}");
    }
    use aws_sdk_s3::types::{
        BucketLifecycleConfiguration, ExpirationStatus, LifecycleExpiration, LifecycleRule,
        LifecycleRuleFilter,
    };

    /// On LocalStack: the abort-multipart rule is merged next to the user's rules, and an
    /// expiration rule over the prefix fails validation. In a bucket of its own: the
    /// bucket-wide expiration rule it sets would fail every other test's validation in the
    /// shared bucket meanwhile.
    /// Eight jobs of one bucket create their resources at once (in a bucket of its own): each
    /// merge of the bucket's one lifecycle document is a read-modify-write, and none loses
    /// another's rule — the merges of a process take turns, and each reads its rule back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs BLOBSNAP_TEST_S3_ENDPOINT; run by scripts/test.sh"]
    async fn concurrent_create_resources_keep_every_rule() {
        let h =
            support::external_in(Some(format!("blobsnap-lcc-{:08x}", rand::random::<u32>()))).await;
        let support::Kind::S3(s3) = &h.kind else {
            unreachable!()
        };
        let jobs: Vec<String> = (0..8).map(|i| format!("{}-{i}", job(&h))).collect();
        let admins: Vec<BlobStoreAdmin> = jobs
            .iter()
            .map(|j| {
                BlobStoreAdmin::new(Arc::clone(&h.store), Some(s3.clone()), j, "1", "d").unwrap()
            })
            .collect();
        futures::future::try_join_all(admins.iter().map(|a| a.create_resources()))
            .await
            .unwrap();
        let rules = s3
            .client()
            .get_bucket_lifecycle_configuration()
            .bucket(&s3.config().bucket)
            .send()
            .await
            .unwrap()
            .rules
            .unwrap_or_default();
        let prefixes: std::collections::BTreeSet<String> = rules
            .iter()
            .filter(|r| r.id().is_some_and(|i| i.starts_with("blobsnap-abort-mpu-")))
            .filter_map(|r| r.filter()?.prefix().map(str::to_string))
            .collect();
        for j in &jobs {
            assert!(
                prefixes.iter().any(|p| p.contains(&format!("{j}/"))),
                "the rule of {j} was lost: {prefixes:?}"
            );
        }
        for a in &admins {
            a.validate_resources().await.unwrap();
        }
        s3.client()
            .delete_bucket_lifecycle()
            .bucket(&s3.config().bucket)
            .send()
            .await
            .unwrap();
        h.cleanup().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs BLOBSNAP_TEST_S3_ENDPOINT; run by scripts/test.sh"]
    async fn lifecycle_rules_are_merged_and_checked() {
        let _turn = LIFECYCLE.lock().await;
        let h =
            support::external_in(Some(format!("blobsnap-lc-{:08x}", rand::random::<u32>()))).await;
        let support::Kind::S3(s3) = &h.kind else {
            unreachable!()
        };
        let bucket = s3.config().bucket.clone();
        let rule = |id: &str, prefix: &str| {
            LifecycleRule::builder()
                .id(id)
                .filter(LifecycleRuleFilter::builder().prefix(prefix).build())
                .status(ExpirationStatus::Enabled)
                .expiration(LifecycleExpiration::builder().days(30).build())
                .build()
                .unwrap()
        };
        let user_rule = format!("user-{}", job(&h));
        s3.client()
            .put_bucket_lifecycle_configuration()
            .bucket(&bucket)
            .lifecycle_configuration(
                BucketLifecycleConfiguration::builder()
                    .rules(rule(&user_rule, "unrelated/"))
                    .build()
                    .unwrap(),
            )
            .send()
            .await
            .unwrap();
        create_validate_and_ownership(&h).await;
        let rules = s3
            .client()
            .get_bucket_lifecycle_configuration()
            .bucket(&bucket)
            .send()
            .await
            .unwrap()
            .rules
            .unwrap_or_default();
        assert!(
            rules.iter().any(|r| r.id() == Some(user_rule.as_str())),
            "the user's rule is kept: {rules:?}"
        );
        assert!(
            rules
                .iter()
                .any(|r| r.id().is_some_and(|i| i.starts_with("blobsnap-abort-mpu-"))),
            "{rules:?}"
        );
        // An expiration rule over our prefix.
        let mut with_bad = rules.clone();
        with_bad.push(rule("expire-everything", ""));
        s3.client()
            .put_bucket_lifecycle_configuration()
            .bucket(&bucket)
            .lifecycle_configuration(
                BucketLifecycleConfiguration::builder()
                    .set_rules(Some(with_bad))
                    .build()
                    .unwrap(),
            )
            .send()
            .await
            .unwrap();
        let e = admin(&h, "deploy-a")
            .validate_resources()
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Permanent, "{e}");
        assert!(e.to_string().contains("expire-everything"), "{e}");
        s3.client()
            .delete_bucket_lifecycle()
            .bucket(&bucket)
            .send()
            .await
            .unwrap();
        h.cleanup().await;
        // The bucket was this test's alone (empty now: the scope's objects are gone).
        let _ = s3.client().delete_bucket().bucket(&bucket).send().await;
    }

    /// The runtime validates before its first commit: the demo against a bucket whose lifecycle
    /// rule expires the job's prefix stops with exit 8 naming the rule, having committed nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs BLOBSNAP_TEST_S3_ENDPOINT; run by scripts/test.sh"]
    async fn the_demo_refuses_a_bucket_that_expires_its_prefix() {
        let _turn = LIFECYCLE.lock().await;
        use aws_sdk_s3::types::{
            BucketLifecycleConfiguration, ExpirationStatus, LifecycleExpiration, LifecycleRule,
            LifecycleRuleFilter,
        };
        // A bucket of its own: the demos of other tests merge their rules into the shared
        // bucket's one lifecycle document meanwhile (from other processes).
        let h =
            support::external_in(Some(format!("blobsnap-lce-{:08x}", rand::random::<u32>()))).await;
        let support::Kind::S3(s3) = &h.kind else {
            unreachable!()
        };
        let bucket = s3.config().bucket.clone();
        let prefix = format!("adm-{:08x}/", rand::random::<u32>());
        let rule_id = format!("expire-{}", prefix.trim_end_matches('/'));
        let existing = s3
            .client()
            .get_bucket_lifecycle_configuration()
            .bucket(&bucket)
            .send()
            .await
            .ok()
            .and_then(|o| o.rules)
            .unwrap_or_default();
        let mut rules = existing.clone();
        rules.push(
            LifecycleRule::builder()
                .id(&rule_id)
                .filter(LifecycleRuleFilter::builder().prefix(&prefix).build())
                .status(ExpirationStatus::Enabled)
                .expiration(LifecycleExpiration::builder().days(30).build())
                .build()
                .unwrap(),
        );
        s3.client()
            .put_bucket_lifecycle_configuration()
            .bucket(&bucket)
            .lifecycle_configuration(
                BucketLifecycleConfiguration::builder()
                    .set_rules(Some(rules))
                    .build()
                    .unwrap(),
            )
            .send()
            .await
            .unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let env = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_string());
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_blobsnap"))
            .args(["--bucket", &bucket, "--s3-endpoint"])
            .arg(s3.config().endpoint.clone().unwrap())
            .arg("--s3-region")
            .arg(
                s3.config()
                    .region
                    .clone()
                    .unwrap_or_else(|| "us-east-1".into()),
            )
            .args(["--s3-path-style", "--s3-prefix", &prefix])
            .arg("demo")
            .arg("--dir")
            .arg(tmp.path())
            .args(["--partitions", "1", "--lines", "300"])
            .env(
                "AWS_ACCESS_KEY_ID",
                env("BLOBSNAP_TEST_S3_ACCESS_KEY", "test"),
            )
            .env(
                "AWS_SECRET_ACCESS_KEY",
                env("BLOBSNAP_TEST_S3_SECRET_KEY", "test"),
            )
            .output()
            .await
            .unwrap();
        // Put the bucket's rules back before asserting.
        let restore = s3
            .client()
            .put_bucket_lifecycle_configuration()
            .bucket(&bucket);
        if existing.is_empty() {
            s3.client()
                .delete_bucket_lifecycle()
                .bucket(&bucket)
                .send()
                .await
                .unwrap();
        } else {
            restore
                .lifecycle_configuration(
                    BucketLifecycleConfiguration::builder()
                        .set_rules(Some(existing))
                        .build()
                        .unwrap(),
                )
                .send()
                .await
                .unwrap();
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(8), "{err}");
        assert!(err.contains(&rule_id), "the rule is named: {err}");
        let listed = blobsnap::blobstore::list_all(
            s3,
            &blobsnap::blobstore::Scope::new(format!("{prefix}wordcount/1/checkpoints/")).unwrap(),
        )
        .await
        .unwrap();
        assert!(listed.is_empty(), "nothing committed: {listed:?}");
        h.cleanup().await;
    }
}
