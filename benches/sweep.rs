//! The sweep at scale (issue 19 §4; not a test: it prints numbers).
//!
//! ```sh
//! cargo bench --bench sweep -- [--objects 1000000] [--store local|s3]
//! ```
//!
//! A word-count job commits a few checkpoints (the roots); then `--objects` orphans — blobs of
//! commits that never happened, 1,000 per failed checkpoint id — are added to its scope (on
//! the local store written straight into its directory, on S3 by PUTs, 64 at a time). Then
//! the sweep runs twice through a counting layer, each time with the process's peak RSS reset
//! first (`/proc/self/clear_refs`): a dry run, then the real run. Each prints its time, peak
//! RSS, requests by kind, and the issue's request bound: list pages + ⌈deletes / 1000⌉ + the
//! server-clock probe + checkpoint listings and GETs + one index GET per retained marker +
//! multipart list/abort calls.
//!
//! Before the sweeps, `blob::usage` (`blobsnap usage`) classifies the same scope, timed and
//! with its peak RSS (issue 32 §6: 10⁶ objects in ≤ 60 s and ≤ 64 MiB on the local store).
//!
//! `--store local` (the default): a local directory store under a temp dir. `--store s3`: the
//! server of `BLOBSNAP_TEST_S3_ENDPOINT` (as `minio/localstack.sh env` prints it; the bucket
//! `BLOBSNAP_TEST_S3_BUCKET` must exist).

mod common;
use common::{arg, one_task_job, peak_rss_mib, reset_peak_rss};

use std::sync::Arc;
use std::time::{Duration, Instant};

use blobsnap::backend::SystemClock;
use blobsnap::blob::gc::{sweep, Doomed, SweepSettings};
use blobsnap::blobstore::counting::{CountSnapshot, CountingStore};
use blobsnap::blobstore::{BlobStore, PutBody, PutOptions};
use blobsnap::id::CheckpointId;
use blobsnap::layout::{JobScope, StoreScope};
use futures::StreamExt as _;

const TASK: &str = "Partition 0";
/// The store of [`one_task_job`].
const STORE: &str = "counts";
const PER_FAILED_COMMIT: u64 = 1_000;

fn orphan(i: u64) -> (CheckpointId, blobsnap::digest::Sha256, Vec<u8>) {
    let body = format!("orphan {i}").into_bytes();
    let id = CheckpointId::new(1_000 + i / PER_FAILED_COMMIT, 1).expect("checkpoint id");
    (id, blobsnap::digest::Sha256::of(&body), body)
}

fn print_run(what: &str, secs: f64, peak_mib: f64, c: &CountSnapshot, deleted: u64) {
    let list_pages = c.list.calls + c.list.requests / 1000;
    let bound_deletes = deleted.div_ceil(1000);
    println!(
        "{what}: {secs:.2} s, peak RSS {:.0} MiB; requests: LIST {} calls / {} keys (≤ {list_pages} pages), GET {}, HEAD {}, PUT {}, DeleteObjects {} (⌈{deleted} / 1000⌉ = {bound_deletes} + the probe's 1), multipart {}",
        peak_mib,
        c.list.calls,
        c.list.requests,
        c.get.calls,
        c.head.calls,
        c.put.calls,
        c.delete.calls,
        c.multipart.calls,
    );
}

fn main() {
    let objects: u64 = arg("--objects")
        .map(|v| v.parse().expect("--objects N"))
        .unwrap_or(100_000);
    let s3 = arg("--store").as_deref() == Some("s3");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("store");
        let base: Arc<dyn BlobStore> = if s3 {
            let mut settings = blobsnap::config::Settings::load(None).expect("settings");
            settings.store.kind = blobsnap::config::StoreKind::S3;
            if let Ok(b) = std::env::var("BLOBSNAP_TEST_S3_BUCKET") {
                settings.s3.bucket = b;
            }
            if let Ok(e) = std::env::var("BLOBSNAP_TEST_S3_ENDPOINT") {
                settings.s3.endpoint = Some(e);
                settings.s3.path_style = true;
            }
            Arc::new(
                blobsnap::blobstore::s3::S3Store::connect(settings.s3)
                    .await
                    .expect("connect to S3"),
            )
        } else {
            Arc::new(blobsnap::blobstore::local::LocalStore::new(&root).expect("local store"))
        };
        let id = format!("{:08x}", rand::random::<u32>());
        let settings = one_task_job(
            "sweep",
            &id,
            &tmp.path().join("state"),
            &tmp.path().join("input"),
            500,
            true,
        );
        blobsnap::job::wordcount::generate_input(&settings.input_dir, 1, 3_000, 3)
            .expect("input");
        let admin = blobsnap::blob::admin::BlobStoreAdmin::new(
            Arc::clone(&base),
            None,
            &settings.job_name,
            &settings.job_id,
            &settings.deployment_id,
        )
        .expect("admin");
        let summaries = blobsnap::job::wordcount::run(
            &settings,
            Arc::clone(&base),
            &admin,
            Arc::new(SystemClock),
            Arc::new(|_, _, _| {}),
        )
        .await
        .expect("the job");
        let commits: u64 = summaries.iter().map(|s| s.commits).sum();

        let scope = JobScope::new("sweep", &id)
            .expect("scope")
            .store(TASK, STORE)
            .expect("store scope");
        let seeding = Instant::now();
        if s3 {
            futures::stream::iter(0..objects)
                .map(|i| {
                    let (base, scope) = (Arc::clone(&base), scope.clone());
                    async move {
                        let (cp, sha, body) = orphan(i);
                        let key = scope.key(&StoreScope::blob_id(cp, sha)).expect("key");
                        base.put(&key, PutBody::Bytes(body.into()), PutOptions::default())
                            .await
                            .expect("seed PUT");
                    }
                })
                .buffer_unordered(64)
                .collect::<Vec<()>>()
                .await;
            // S3's last-modified has whole seconds: let the cutoff (grace 0) pass them.
            tokio::time::sleep(Duration::from_secs(2)).await;
        } else {
            let root = root.clone();
            let scope = scope.clone();
            tokio::task::spawn_blocking(move || {
                for i in 0..objects {
                    let (cp, sha, body) = orphan(i);
                    let key = scope.key(&StoreScope::blob_id(cp, sha)).expect("key");
                    let path = root.join(key.as_str());
                    if i % PER_FAILED_COMMIT == 0 {
                        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
                    }
                    std::fs::write(&path, body).expect("seed file");
                }
            })
            .await
            .expect("seeding");
            std::thread::sleep(Duration::from_millis(20));
        }
        println!(
            "store {}: job committed {commits} checkpoints; {objects} orphans seeded in {:.1} s",
            if s3 { "s3" } else { "local" },
            seeding.elapsed().as_secs_f64()
        );

        // `blobsnap usage` over the same scope: one streamed listing, every object classed.
        {
            reset_peak_rss();
            let started = Instant::now();
            let report = blobsnap::blob::usage::usage(
                &base,
                "sweep",
                &id,
                Some(Duration::ZERO),
                blobsnap::backend::Clock::now(&SystemClock),
            )
            .await
            .expect("usage");
            let leak = &report.classes["orphans-past-grace"];
            println!(
                "usage: {:.2} s, peak RSS {:.0} MiB; {} objects / {} bytes classified, {} orphans past the grace",
                started.elapsed().as_secs_f64(),
                peak_rss_mib(),
                report.total_objects,
                report.total_bytes,
                leak.objects
            );
            assert!(leak.objects >= objects, "every orphan classed as a leak");
        }

        let sweep_settings = SweepSettings {
            job_name: "sweep".into(),
            job_id: id.clone(),
            task: None,
            store: None,
            grace: Duration::ZERO,
        };
        for dry_run in [true, false] {
            let counting = CountingStore::new(Arc::clone(&base));
            let counters = counting.counters();
            let store: Arc<dyn BlobStore> = Arc::new(counting);
            reset_peak_rss();
            let started = Instant::now();
            let mut doomed = 0u64;
            let report = sweep(&store, &sweep_settings, dry_run, &mut |_: &Doomed| doomed += 1)
                .await
                .expect("sweep");
            let secs = started.elapsed().as_secs_f64();
            let c = counters.snapshot();
            print_run(
                if dry_run { "dry run" } else { "sweep" },
                secs,
                peak_rss_mib(),
                &c,
                report.deleted,
            );
            println!(
                "  roots {}, live {}, doomed {doomed} (seeded {objects}), deleted {}, kept young {}",
                report.plan.roots, report.plan.live, report.deleted, report.plan.kept_young
            );
            assert!(doomed >= objects, "every orphan doomed: {doomed} < {objects}");
            if !dry_run {
                assert_eq!(report.deleted, doomed, "deleted what was decided");
            }
        }
    });
}
