//! The unit tests of `blobstore/limit.rs` (in a file of their own beside it).

use super::super::local::LocalStore;
use super::*;
use crate::blobstore::fault::{FaultConfig, FaultStore, OpRates};
use bytes::Bytes;
use futures::FutureExt as _;

fn key(name: &str) -> BlobKey {
    BlobKey::new(format!("t/{name}")).expect("a valid key")
}

async fn drain(store: &dyn BlobStore, k: &BlobKey) -> u64 {
    let mut got = store.get(k, None).await.expect("get");
    let mut n = 0;
    while let Some(chunk) = got.body.next().await {
        n += chunk.expect("chunk").len() as u64;
    }
    n
}

fn within(measured: f64, target: f64, tolerance: f64) -> bool {
    (measured - target).abs() <= target * tolerance
}

/// A store of window `window` over a local dir, holding the 5-byte object `x`.
async fn with_x(dir: &std::path::Path, window: usize) -> (Arc<LimitStore<LocalStore>>, Budget) {
    let budget = Budget::new(window);
    let store = Arc::new(LimitStore::new(
        LocalStore::new(dir).expect("local store"),
        budget.clone(),
    ));
    store
        .put(
            &key("x"),
            PutBody::Bytes(Bytes::from_static(b"bytes")),
            PutOptions::default(),
        )
        .await
        .expect("put");
    (store, budget)
}

/// A request in the urgent lane does not queue behind the transfers that fill the window:
/// with a window of 1 held by a GET whose body is not read, a plain GET waits and an
/// urgent one completes; the plain one completes once the window frees. The lane's own
/// permits bound the urgent ones too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_urgent_lane_passes_a_full_window() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (store, budget) = with_x(tmp.path(), 1).await;
    // The window's one permit, held by a body nobody reads.
    let held = store.get(&key("x"), None).await.expect("get");
    let plain = {
        let store = Arc::clone(&store);
        tokio::spawn(async move { drain(store.as_ref(), &key("x")).await })
    };
    // The urgent lane: bounded by its own permits, never by the window.
    let urgent_reads = (0..2 * URGENT_LANE).map(|_| {
        let store = Arc::clone(&store);
        tokio::spawn(urgent(
            async move { drain(store.as_ref(), &key("x")).await },
        ))
    });
    for r in urgent_reads {
        let n = tokio::time::timeout(Duration::from_secs(60), r)
            .await
            .expect("an urgent GET does not wait for the window")
            .expect("task");
        assert_eq!(n, 5);
    }
    assert!(!plain.is_finished(), "the plain GET waits for the window");
    assert_eq!(budget.in_flight(), 1, "urgent permits are given back");
    drop(held);
    let n = tokio::time::timeout(Duration::from_secs(60), plain)
        .await
        .expect("the plain GET runs once the window frees")
        .expect("task");
    assert_eq!(n, 5);
    assert_eq!(
        budget.window(),
        1,
        "the urgent lane leaves the window alone"
    );
}

/// Background transfers hold at most half the window: with a window of 4 and two
/// background bodies unread, a third background GET waits while a plain one runs.
#[tokio::test]
async fn the_background_lane_leaves_half_the_window_to_the_rest() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (store, budget) = with_x(tmp.path(), 4).await;
    let held = background(async {
        (
            store.get(&key("x"), None).await.expect("get"),
            store.get(&key("x"), None).await.expect("get"),
        )
    })
    .await;
    assert_eq!(budget.in_flight(), 2);
    let third = {
        let store = Arc::clone(&store);
        tokio::spawn(background(
            async move { drain(store.as_ref(), &key("x")).await },
        ))
    };
    let n = tokio::time::timeout(Duration::from_secs(60), drain(store.as_ref(), &key("x")))
        .await
        .expect("a plain GET finds room beside the background lane");
    assert_eq!(n, 5);
    assert!(
        !third.is_finished(),
        "a third background GET waits for its lane"
    );
    drop(held);
    let n = tokio::time::timeout(Duration::from_secs(60), third)
        .await
        .expect("the background GET runs once its lane frees")
        .expect("task");
    assert_eq!(n, 5);
}

/// A download limit holds within ±10 % over a simulated minute, with two readers (two
/// tasks) sharing it, each getting a fair share.
#[tokio::test(start_paused = true)]
async fn download_limit_holds_over_a_minute_and_two_tasks_share_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rate = 4u64 << 20;
    let budget = Budget::with_limits(Limits {
        download_bytes_per_sec: rate,
        ..Limits::transfers(8)
    });
    let store = Arc::new(LimitStore::new(
        LocalStore::new(tmp.path()).expect("local store"),
        budget.clone(),
    ));
    let object = Bytes::from(vec![7u8; 3 << 20]);
    for name in ["a", "b"] {
        store
            .inner
            .put(
                &key(name),
                PutBody::Bytes(object.clone()),
                PutOptions::default(),
            )
            .await
            .expect("put");
    }
    let start = Instant::now();
    let minute = Duration::from_secs(60);
    let reader = |name: &'static str| {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            let mut total = 0u64;
            // Bounded, so that a limiter that lets everything through fails, not hangs.
            while start.elapsed() < minute && total < 2 * rate * 60 {
                total += drain(store.as_ref(), &key(name)).await;
            }
            total
        })
    };
    let (a, b) = (reader("a"), reader("b"));
    let (a, b) = (a.await.expect("task a"), b.await.expect("task b"));
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    let measured = (a + b) as f64 / secs;
    assert!(
        within(measured, rate as f64, 0.10),
        "{measured:.0} B/s over {secs:.1} s against a limit of {rate} B/s"
    );
    let share = a as f64 / (a + b) as f64;
    assert!(
        (0.4..=0.6).contains(&share),
        "task a got {share:.2} of the bandwidth ({a} vs {b} bytes)"
    );
    assert!(budget.waited(Limit::Download) > Duration::from_secs(30));
}

/// An upload limit holds within ±10 % over a simulated minute.
#[tokio::test(start_paused = true)]
async fn upload_limit_holds_over_a_minute() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rate = 2u64 << 20;
    let store = LimitStore::new(
        LocalStore::new(tmp.path()).expect("local store"),
        Budget::with_limits(Limits {
            upload_bytes_per_sec: rate,
            ..Limits::transfers(4)
        }),
    );
    let body = Bytes::from(vec![1u8; 700 << 10]);
    let start = Instant::now();
    let mut total = 0u64;
    let mut i = 0;
    while start.elapsed() < Duration::from_secs(60) && total < 2 * rate * 60 {
        store
            .put(
                &key(&format!("u{i}")),
                PutBody::Bytes(body.clone()),
                PutOptions::default(),
            )
            .await
            .expect("put");
        total += body.len() as u64;
        i += 1;
    }
    let measured = total as f64 / start.elapsed().as_secs_f64().max(1e-9);
    assert!(
        within(measured, rate as f64, 0.10),
        "{measured:.0} B/s against a limit of {rate} B/s"
    );
}

/// A paced download is bound by its pace chunk by chunk, within one object, streamed or
/// in ranges, with no `LimitStore` in the way (the lazy restore's background download: F8
/// of the lazy-restore review: a sleep after each file let each file go at line rate), and
/// a lifted pace stops pacing. Real time: the ranged download's follower is a blocking
/// task for the whole download, which holds tokio's paused clock still; the bounds
/// asserted are ones pacing guarantees (a least duration, and an end long before an
/// unlifted pace would allow).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pace_bounds_a_download_within_the_object() {
    use crate::blobstore::transfer::{download_to_file, DownloadOptions};
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tempfile::tempdir().expect("tempdir");
    let store = LocalStore::new(tmp.path()).expect("local store");
    let size = 2u64 << 20;
    store
        .put(
            &key("big"),
            PutBody::Bytes(Bytes::from(vec![7u8; size as usize])),
            PutOptions::default(),
        )
        .await
        .expect("put");
    let opts = |part_size| DownloadOptions {
        expected_size: size,
        expected_sha256: None,
        part_size,
        concurrency: 4,
    };
    let rate = 4u64 << 20;
    // Less one burst (100 ms of the rate), which passes at once.
    let least = Duration::from_secs_f64((size - rate / 10) as f64 / rate as f64);
    for part_size in [0, 512 << 10] {
        let start = std::time::Instant::now();
        paced(
            Pace::new(rate).expect("a pace"),
            download_to_file(&store, &key("big"), &out.path().join("a"), opts(part_size)),
        )
        .await
        .expect("download");
        assert!(
            start.elapsed() >= least,
            "parts of {part_size}: one object of {size} bytes in {:?} at a pace of {rate} B/s",
            start.elapsed()
        );
    }
    // A pace of 1 B/s (the object would take weeks), lifted after 200 ms by another task
    // (RocksDB now waits for the file): the rest lands at once.
    let lift = Arc::new(Lift::default());
    let lifter = tokio::spawn({
        let lift = Arc::clone(&lift);
        async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            lift.lift();
        }
    });
    let start = std::time::Instant::now();
    paced(
        Pace::new(1).expect("a pace").liftable(Arc::clone(&lift)),
        download_to_file(&store, &key("big"), &out.path().join("c"), opts(0)),
    )
    .await
    .expect("download");
    lifter.await.expect("lifter");
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "a lifted pace still paced: {:?}",
        start.elapsed()
    );
}

/// A request rate holds within ±10 % over a simulated minute.
#[tokio::test(start_paused = true)]
async fn request_rate_holds_over_a_minute() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = LimitStore::new(
        LocalStore::new(tmp.path()).expect("local store"),
        Budget::with_limits(Limits {
            requests_per_sec: 50,
            ..Limits::transfers(4)
        }),
    );
    store
        .put(
            &key("h"),
            PutBody::Bytes(Bytes::from_static(b"x")),
            PutOptions::default(),
        )
        .await
        .expect("put");
    let start = Instant::now();
    let mut heads = 0u64;
    while start.elapsed() < Duration::from_secs(60) && heads < 2 * 50 * 60 {
        store.head(&key("h")).await.expect("head");
        heads += 1;
    }
    let measured = heads as f64 / start.elapsed().as_secs_f64().max(1e-9);
    assert!(
        within(measured, 50.0, 0.10),
        "{measured:.1} requests/s against 50"
    );
}

/// Throttling responses halve the window for everyone (once per second at most), down to
/// one transfer; successes widen it back to the limit.
#[tokio::test(start_paused = true)]
async fn slowdown_halves_the_window_for_every_task_and_successes_widen_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let faulty = FaultStore::new(
        LocalStore::new(tmp.path()).expect("local store"),
        FaultConfig {
            error_rate: OpRates {
                head: 1.0,
                ..OpRates::default()
            },
            throttle: true,
            ..FaultConfig::default()
        },
    );
    let budget = Budget::new(8);
    let store = LimitStore::new(faulty, budget.clone());
    store
        .put(
            &key("o"),
            PutBody::Bytes(Bytes::from_static(b"body")),
            PutOptions::default(),
        )
        .await
        .expect("put");
    assert_eq!(budget.window(), 8);

    let e = store.head(&key("o")).await.expect_err("throttled");
    assert!(e.is_throttling(), "{e}");
    assert_eq!(budget.window(), 4);
    // The same burst of responses: one signal.
    let _ = store.head(&key("o")).await;
    assert_eq!(budget.window(), 4);
    for expected in [2, 1, 1] {
        tokio::time::advance(CUT_AT_MOST_EVERY).await;
        let _ = store.head(&key("o")).await;
        assert_eq!(budget.window(), expected);
    }
    assert_eq!(budget.throttled(), 5);

    // Successes widen it by 1/window each, back to the limit: gradually (1 → 8 takes
    // about 1 + 2 + … + 7 successes), never past it.
    let mut successes = 0;
    while budget.window() < 8 && successes < 100 {
        drain(&store, &key("o")).await;
        successes += 1;
    }
    assert_eq!(budget.window(), 8);
    assert!(
        (20..=40).contains(&successes),
        "{successes} successes to widen 1 → 8"
    );
    drain(&store, &key("o")).await;
    assert_eq!(budget.window(), 8);
}

/// Permits held while the window narrows are kept out when given back, not returned.
#[tokio::test(start_paused = true)]
async fn a_narrowed_window_takes_back_permits_as_they_return() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = LimitStore::new(
        LocalStore::new(tmp.path()).expect("local store"),
        Budget::new(4),
    );
    let k = key("o");
    store
        .put(
            &k,
            PutBody::Bytes(Bytes::from_static(b"body")),
            PutOptions::default(),
        )
        .await
        .expect("put");
    let held: Vec<_> = futures::future::join_all((0..4).map(|_| store.get(&k, None)))
        .await
        .into_iter()
        .collect::<Result<_>>()
        .expect("four gets");
    store.budget.narrow();
    assert_eq!(store.budget.window(), 2);
    drop(held);
    assert_eq!(store.budget.in_flight(), 0);
    let two: Vec<_> = futures::future::join_all((0..2).map(|_| store.get(&k, None)))
        .await
        .into_iter()
        .collect::<Result<_>>()
        .expect("two gets");
    let mut third = Box::pin(store.get(&k, None));
    assert!(
        (&mut third).now_or_never().is_none(),
        "a third transfer started"
    );
    drop(two);
    drop(third.await.expect("third get"));
}
