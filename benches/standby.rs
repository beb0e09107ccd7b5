//! A warm standby over a long run (issue 18 §2: bounded memory; not a test: it prints numbers).
//!
//! ```sh
//! cargo bench --bench standby -- [--commits 400] [--lines-per-commit 2000]
//! ```
//!
//! A word-count task (one store) commits `--commits` times on the local store while a standby
//! in the same process follows it (poll 50 ms) into a dir of its own. Every Rust allocation of
//! the process goes through a counting allocator: its live heap is sampled at every checkpoint
//! the standby applies, and the table shows it at each tenth of the run beside the process's
//! RSS — a standby that kept something per commit would grow with the commit count. Also: the
//! commits the standby applied, skipped and polled past, and its own requests per poll.

mod common;
use common::{arg, one_task_job, rss_mib};

use std::alloc::System;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use blobsnap::backend::{StateBackendFactory, SystemClock};
use blobsnap::blob::factory::BlobStateBackendFactory;
use blobsnap::blob::restore::RestoreSettings;
use blobsnap::blobstore::counting::CountingStore;
use blobsnap::blobstore::BlobStore;
use blobsnap::job::standby::{follow, StandbySettings, StandbyUpdate};
use stats_alloc::{StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Bytes the process's Rust code holds now (the allocator counts a reallocation's growth as
/// allocated and its shrinking as deallocated).
fn heap_now() -> u64 {
    let s = GLOBAL.stats();
    s.bytes_allocated.saturating_sub(s.bytes_deallocated) as u64
}

fn backend(store: &Arc<dyn BlobStore>) -> Arc<dyn StateBackendFactory> {
    Arc::new(BlobStateBackendFactory::new(
        Arc::clone(store),
        None,
        Default::default(),
        RestoreSettings::default(),
        "bench",
    ))
}

fn main() {
    let commits: u64 = arg("--commits").map_or(400, |v| v.parse().expect("--commits N"));
    let per: u64 =
        arg("--lines-per-commit").map_or(2000, |v| v.parse().expect("--lines-per-commit N"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let tmp = tempfile::tempdir().expect("tempdir");
        let input = tmp.path().join("input");
        blobsnap::job::wordcount::generate_input(&input, 1, commits * per, 9).expect("input");
        let local: Arc<dyn BlobStore> = Arc::new(
            blobsnap::blobstore::local::LocalStore::new(tmp.path().join("store")).expect("store"),
        );
        let task_settings = one_task_job("soak", "1", &tmp.path().join("a"), &input, per, false);
        let standby_settings =
            one_task_job("soak", "1", &tmp.path().join("c"), &input, per, false);

        // The standby, with requests of its own counted.
        let counting = CountingStore::new(Arc::clone(&local));
        let standby_counters = counting.counters();
        let standby_store: Arc<dyn BlobStore> = Arc::new(counting);
        let samples = Arc::new(Mutex::new(Vec::<(u64, u64, f64)>::new()));
        let (applied, skipped, unchanged) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
        );
        let stop = tokio_util::sync::CancellationToken::new();
        let standby = {
            let (samples, applied, skipped, unchanged, stop) = (
                Arc::clone(&samples),
                Arc::clone(&applied),
                Arc::clone(&skipped),
                Arc::clone(&unchanged),
                stop.clone(),
            );
            tokio::spawn(async move {
                let on_update = move |u: &StandbyUpdate| match u {
                    StandbyUpdate::Applied { seq, .. } => {
                        applied.fetch_add(1, Ordering::Relaxed);
                        samples
                            .lock()
                            .expect("samples")
                            .push((*seq, heap_now(), rss_mib()));
                    }
                    StandbyUpdate::Skipped { .. } => {
                        skipped.fetch_add(1, Ordering::Relaxed);
                    }
                    StandbyUpdate::Unchanged { .. } => {
                        unchanged.fetch_add(1, Ordering::Relaxed);
                    }
                };
                follow(
                    &standby_settings,
                    "Partition 0",
                    Arc::clone(&standby_store),
                    &backend(&standby_store),
                    Arc::new(SystemClock),
                    &StandbySettings {
                        poll: Duration::from_millis(50),
                    },
                    stop,
                    &on_update,
                )
                .await
            })
        };

        let admin = blobsnap::blob::admin::BlobStoreAdmin::new(
            Arc::clone(&local),
            None,
            "soak",
            "1",
            "bench",
        )
        .expect("admin");
        let t = std::time::Instant::now();
        let summaries = blobsnap::job::wordcount::run(
            &task_settings,
            Arc::clone(&local),
            &admin,
            Arc::new(SystemClock),
            Arc::new(|_, _, _| {}),
        )
        .await
        .expect("the task");
        let made: u64 = summaries.iter().map(|s| s.commits).sum();
        let run_secs = t.elapsed().as_secs_f64();
        // The standby idles a second past the last commit: its polls then find nothing new.
        let idle_before = (standby_counters.snapshot(), unchanged.load(Ordering::Relaxed));
        tokio::time::sleep(Duration::from_secs(2)).await;
        let idle_after = (standby_counters.snapshot(), unchanged.load(Ordering::Relaxed));
        stop.cancel();
        standby.await.expect("standby task").expect("standby");

        let samples = samples.lock().expect("samples").clone();
        println!(
            "standby soak: the task made {made} commits in {run_secs:.1} s; the standby applied {}, skipped {}, found nothing new {} times",
            applied.load(Ordering::Relaxed),
            skipped.load(Ordering::Relaxed),
            unchanged.load(Ordering::Relaxed)
        );
        println!("| applied | checkpoint # | heap (MiB) | RSS (MiB) |");
        println!("|---|---|---|---|");
        let n = samples.len();
        let mut shown = std::collections::BTreeSet::new();
        for tenth in 0..=10 {
            let i = (n.saturating_sub(1) * tenth / 10).min(n.saturating_sub(1));
            if n == 0 || !shown.insert(i) {
                continue;
            }
            let (seq, heap, rss) = samples[i];
            println!(
                "| {} | {seq} | {:.1} | {rss:.0} |",
                i + 1,
                heap as f64 / (1 << 20) as f64
            );
        }
        let peak = samples.iter().map(|s| s.1).max().unwrap_or(0);
        println!("heap peak at an applied checkpoint: {:.1} MiB", peak as f64 / (1 << 20) as f64);
        let (b, a) = (idle_before, idle_after);
        let polls = a.1 - b.1;
        let d = a.0.since(&b.0);
        println!(
            "idle: {polls} polls in 2 s made LIST {} / GET {} / HEAD {} requests ({:.2} per poll)",
            d.list.calls,
            d.get.calls,
            d.head.calls,
            (d.list.calls + d.get.calls + d.head.calls) as f64 / polls.max(1) as f64
        );
    });
}
