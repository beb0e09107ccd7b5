//! One budget for every task and store of a process: [`LimitStore`] makes each request of the
//! store it wraps draw on one shared [`Budget`], which holds
//!
//! - **a window of transfers in flight** (`store.max-transfers`): each PUT, GET, HEAD and batch
//!   delete waits for a permit, in FIFO order, and a GET keeps its permit until its body has
//!   been read to the end or dropped (a permit bounds what is on the wire, not how long a
//!   request took to start). Listings and multipart bookkeeping hold no permit, so a consumer
//!   that reads objects while it lists cannot wait on itself;
//! - **bandwidth limits** (`store.max-upload-rate`, `store.max-download-rate`, bytes/s): a GET's
//!   body is paid for chunk by chunk as it is read (a throttled reader leaves the rest in the
//!   socket, and TCP slows the sender); a PUT pays for its body before it starts, in slices of
//!   at most one burst (100 ms of the rate), because the store under the layer reads the file
//!   itself. Over any window the bytes moved stay within the rate plus one burst;
//! - **a request rate** (`store.max-request-rate`, requests/s): every PUT, GET, HEAD, batch
//!   delete and multipart listing pays one request, a listing one per 1,000 keys (an S3 page),
//!   a multipart PUT the parts and the completion it reports, after the fact;
//! - **AIMD on throttling**: a response the store marks as throttling (S3 `503 SlowDown`, `429`;
//!   [`Error::is_throttling`]) halves the window of transfers for the whole process, at most
//!   once per second, and every success then widens it by `1/window` (one permit per window of
//!   successes) back up to `max-transfers`. One task's `SlowDown` slows every task down, as the
//!   store asked, not only the request that got it.
//!
//! **An urgent lane.** A request made inside [`urgent`] — a lazily restored store's fetch that
//! RocksDB is waiting for — takes a transfer permit if one is free and otherwise one of
//! [`URGENT_LANE`] permits of its own, so it never queues behind the background download or
//! the uploads that hold the window (it still pays the bandwidth and request rates, which are
//! the operator's hard limits). At most `max-transfers + URGENT_LANE` transfers are then in
//! flight.
//!
//! **A background lane.** A request made inside [`background`] — a pre-upload of a file no
//! commit needs yet ([`crate::blob::commit::preupload`]) — first takes one of `max(1, max-transfers /
//! 2)` background permits, then a transfer permit like any other: background work never holds
//! more than half the window, so a commit's uploads always find room beside it.
//!
//! **A pace of its own.** The downloads made inside [`paced`]
//! ([`super::transfer::download_to_file`], with or without this layer) pay a [`Pace`] for
//! every chunk they receive: a token bucket of bytes per second beside the budget's (a lazy
//! restore's background download, bounded by `[job] lazy-download-rate`), so the bound holds
//! within a file as across files. A [`Lift`] ends one activity's pace (a background fetch
//! that RocksDB now waits for).
//!
//! The rate limits are token buckets (GCRA, the `governor` crate) on a clock of tokio's
//! `Instant`, so tests on tokio's paused clock drive them; waiters queue in FIFO order, so no
//! task starves another. Time spent waiting is published per limit
//! (`blobsnap_limit_wait_seconds{limit="transfers"|"upload"|"download"|"requests"}`) and kept
//! in [`Budget::waited`].
//!
//! The layer sits under the retry layer (`Retry(Limit(Counting(store)))`, as
//! [`crate::config::Settings::open_store`] builds it): a request waiting out a backoff holds
//! no permit, and every retry pays again. A multipart PUT is one permit; its parts are bounded
//! by the S3 store's own `max-parts-in-flight`.

use std::num::NonZeroU32;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::StreamExt as _;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::{
    BlobKey, BlobStore, Capabilities, DeleteFailures, GetResult, ObjectMeta, Probe, PutBody,
    PutOptions, PutResult, Scope, Uploads,
};
use crate::error::{Error, ErrorKind, Result};

/// The limits of one [`Budget`]. A rate of 0 is no limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Transfers in flight at once (at least 1), and the most the AIMD window opens to.
    pub transfers: usize,
    /// Bytes per second uploaded (PUT bodies).
    pub upload_bytes_per_sec: u64,
    /// Bytes per second downloaded (GET bodies).
    pub download_bytes_per_sec: u64,
    /// Requests per second.
    pub requests_per_sec: u64,
}

impl Limits {
    /// `transfers` at once and no rate limit.
    pub fn transfers(transfers: usize) -> Self {
        Limits {
            transfers,
            upload_bytes_per_sec: 0,
            download_bytes_per_sec: 0,
            requests_per_sec: 0,
        }
    }
}

/// Which of a budget's limits a wait was for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// A place in the window of transfers.
    Transfers,
    /// Upload bandwidth.
    Upload,
    /// Download bandwidth.
    Download,
    /// Request rate.
    Requests,
}

impl Limit {
    const ALL: [Limit; 4] = [
        Limit::Transfers,
        Limit::Upload,
        Limit::Download,
        Limit::Requests,
    ];

    /// Its name in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Transfers => "transfers",
            Limit::Upload => "upload",
            Limit::Download => "download",
            Limit::Requests => "requests",
        }
    }
}

/// A clock of tokio's `Instant` for `governor`: time since the budget was made, which the
/// paused clock of a test advances.
#[derive(Clone, Debug)]
struct TokioClock(Instant);

impl governor::clock::Clock for TokioClock {
    type Instant = Duration;

    fn now(&self) -> Duration {
        self.0.elapsed()
    }
}

type Gcra = RateLimiter<
    NotKeyed,
    InMemoryState,
    TokioClock,
    governor::middleware::NoOpMiddleware<Duration>,
>;

/// One token bucket: `cell` units (bytes or requests) per token, a burst of 100 ms of the
/// rate, waiters served in FIFO order.
struct Rate {
    gcra: Gcra,
    clock: TokioClock,
    /// Units per token: large rates count in cells, so that the bucket's refill interval (whole
    /// nanoseconds) stays ≥ 1 µs and its rounding under 0.1 %.
    cell: u64,
    /// Tokens one wait may take at most.
    burst: u32,
    queue: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rate")
            .field("cell", &self.cell)
            .field("burst", &self.burst)
            .finish_non_exhaustive()
    }
}

impl Rate {
    /// A bucket of `per_sec` units per second; `None` for 0 (no limit).
    fn new(per_sec: u64, clock: &TokioClock) -> Option<Rate> {
        if per_sec == 0 {
            return None;
        }
        let cell = per_sec.div_ceil(1_000_000).max(1);
        let cells_per_sec = (per_sec / cell).max(1);
        let period_nanos = (1_000_000_000u128 * u128::from(cell) / u128::from(per_sec)).max(1);
        let burst = u32::try_from((cells_per_sec / 10).max(1)).unwrap_or(u32::MAX);
        let quota = Quota::with_period(Duration::from_nanos(
            u64::try_from(period_nanos).unwrap_or(u64::MAX),
        ))?
        .allow_burst(NonZeroU32::new(burst)?);
        Some(Rate {
            gcra: RateLimiter::direct_with_clock(quota, clock.clone()),
            clock: clock.clone(),
            cell,
            burst,
            queue: tokio::sync::Mutex::new(()),
        })
    }

    /// Wait until `units` may pass; returns the time waited. Each slice of at most one burst
    /// queues anew, so a large payment interleaves with other waiters'.
    async fn take(&self, units: u64) -> Duration {
        let mut cells = units.div_ceil(self.cell);
        let mut waited = Duration::ZERO;
        while cells > 0 {
            let n = u32::try_from(cells.min(u64::from(self.burst))).unwrap_or(self.burst);
            cells -= u64::from(n);
            let Some(n) = NonZeroU32::new(n) else { break };
            let _turn = self.queue.lock().await;
            loop {
                match self.gcra.check_n(n) {
                    Ok(Ok(())) | Err(_) => break,
                    Ok(Err(not_until)) => {
                        let wait =
                            not_until.wait_time_from(governor::clock::Clock::now(&self.clock));
                        waited += wait;
                        tokio::time::sleep(wait).await;
                    }
                }
            }
        }
        waited
    }
}

/// The AIMD window over the transfer permits: permits are taken out of the semaphore when it
/// halves (at once if free, else as they come back) and added back as it widens.
#[derive(Debug)]
struct Window {
    /// The window's size, 1 ..= `Limits::transfers`.
    size: f64,
    /// Permits taken out of the semaphore.
    withheld: usize,
    /// Permits still to take out as their holders give them back.
    owed: usize,
    /// When the window last halved.
    last_cut: Option<Instant>,
}

/// How often the window may halve: the responses of one burst of throttled requests are one
/// signal, not many.
const CUT_AT_MOST_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct Shared {
    limits: Limits,
    permits: Arc<Semaphore>,
    /// The urgent lane's own permits ([`URGENT_LANE`]).
    urgent: Arc<Semaphore>,
    /// The background lane's cap: half the window ([`background`]).
    background: Arc<Semaphore>,
    window: Mutex<Window>,
    in_flight: AtomicUsize,
    peak: AtomicUsize,
    upload: Option<Rate>,
    download: Option<Rate>,
    requests: Option<Rate>,
    waited_nanos: [AtomicU64; 4],
    throttled: AtomicU64,
}

/// Permits of the urgent lane (see the module docs), beyond `max-transfers`.
pub const URGENT_LANE: usize = 2;

tokio::task_local! {
    static URGENT: ();
    static BACKGROUND: ();
    static PACE: Pace;
}

/// A token bucket of bytes per second that the GET bodies read inside [`paced`] stay under,
/// beside the budget's own limits; clones share the bucket. A burst is 100 ms of the rate.
#[derive(Clone, Debug)]
pub struct Pace {
    rate: Arc<Rate>,
    lift: Option<Arc<Lift>>,
}

impl Pace {
    /// A bucket of `bytes_per_sec`; `None` for 0 (no bound).
    pub fn new(bytes_per_sec: u64) -> Option<Pace> {
        Rate::new(bytes_per_sec, &TokioClock(Instant::now())).map(|r| Pace {
            rate: Arc::new(r),
            lift: None,
        })
    }

    /// The same bucket, no longer paid once `lift` is lifted (a background fetch that RocksDB
    /// now waits for finishes at line rate).
    pub fn liftable(&self, lift: Arc<Lift>) -> Pace {
        Pace {
            rate: Arc::clone(&self.rate),
            lift: Some(lift),
        }
    }

    async fn take(&self, units: u64) {
        let Some(lift) = &self.lift else {
            self.rate.take(units).await;
            return;
        };
        let lifted = lift.notify.notified();
        tokio::pin!(lifted);
        // Registered before the flag is read: a lift between the two still wakes it.
        lifted.as_mut().enable();
        if lift.is_lifted() {
            return;
        }
        tokio::select! {
            _ = self.rate.take(units) => {}
            () = lifted => {}
        }
    }
}

/// Lifts a [`Pace`] for the reads of one activity, from any thread.
#[derive(Debug, Default)]
pub struct Lift {
    lifted: AtomicBool,
    notify: tokio::sync::Notify,
}

impl Lift {
    /// From now on the paces made [`Pace::liftable`] with this lift are not paid, and a wait
    /// for one ends.
    pub fn lift(&self) {
        self.lifted.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    /// Whether [`Lift::lift`] was called.
    pub fn is_lifted(&self) -> bool {
        self.lifted.load(Ordering::Acquire)
    }
}

/// Run `f` with every chunk its downloads receive paying `pace` (see the module docs).
pub async fn paced<F: std::future::Future>(pace: Pace, f: F) -> F::Output {
    PACE.scope(pace, f).await
}

/// Pay `bytes` to the pace of the current task, if it runs in [`paced`].
pub(crate) async fn pace(bytes: u64) {
    if let Ok(pace) = PACE.try_with(Pace::clone) {
        pace.take(bytes).await;
    }
}

/// Run `f` in the background lane: its transfers hold at most half the window (see the module
/// docs), below the commits' uploads.
pub async fn background<F: std::future::Future>(f: F) -> F::Output {
    BACKGROUND.scope((), f).await
}

/// Whether the current task runs in [`background`].
fn is_background() -> bool {
    BACKGROUND.try_with(|()| ()).is_ok()
}

/// Run `f` in the urgent lane: its requests do not queue behind the others' transfers (a lazy
/// restore's fetch that RocksDB waits for; see the module docs).
pub async fn urgent<F: std::future::Future>(f: F) -> F::Output {
    URGENT.scope((), f).await
}

/// Whether the current task runs in [`urgent`].
fn is_urgent() -> bool {
    URGENT.try_with(|()| ()).is_ok()
}

/// The process's one budget of transfers, bandwidth and requests, shared by every clone.
#[derive(Clone, Debug)]
pub struct Budget {
    shared: Arc<Shared>,
}

impl Budget {
    /// A budget of `size` transfers at once (at least 1) and no rate limit.
    pub fn new(size: usize) -> Self {
        Budget::with_limits(Limits::transfers(size))
    }

    /// A budget of `limits`.
    pub fn with_limits(limits: Limits) -> Self {
        let limits = Limits {
            transfers: limits.transfers.max(1),
            ..limits
        };
        let clock = TokioClock(Instant::now());
        // The window starts whole: its gauge shows that before the first throttle moves it.
        metrics::gauge!("blobsnap_transfer_window").set(limits.transfers as f64);
        Budget {
            shared: Arc::new(Shared {
                limits,
                permits: Arc::new(Semaphore::new(limits.transfers)),
                urgent: Arc::new(Semaphore::new(URGENT_LANE)),
                background: Arc::new(Semaphore::new((limits.transfers / 2).max(1))),
                window: Mutex::new(Window {
                    size: limits.transfers as f64,
                    withheld: 0,
                    owed: 0,
                    last_cut: None,
                }),
                in_flight: AtomicUsize::new(0),
                peak: AtomicUsize::new(0),
                upload: Rate::new(limits.upload_bytes_per_sec, &clock),
                download: Rate::new(limits.download_bytes_per_sec, &clock),
                requests: Rate::new(limits.requests_per_sec, &clock),
                waited_nanos: Default::default(),
                throttled: AtomicU64::new(0),
            }),
        }
    }

    /// The limits it was made with.
    pub fn limits(&self) -> Limits {
        self.shared.limits
    }

    /// Transfers allowed at once (`Limits::transfers`).
    pub fn size(&self) -> usize {
        self.shared.limits.transfers
    }

    /// Transfers allowed at once now: the AIMD window, which throttling responses narrow.
    pub fn window(&self) -> usize {
        let w = self.lock_window();
        self.shared.limits.transfers - w.withheld - w.owed
    }

    /// Transfers holding a permit now.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::Relaxed)
    }

    /// The most transfers that held a permit at once since the budget was made.
    pub fn peak(&self) -> usize {
        self.shared.peak.load(Ordering::Relaxed)
    }

    /// Throttling responses seen.
    pub fn throttled(&self) -> u64 {
        self.shared.throttled.load(Ordering::Relaxed)
    }

    /// Time requests spent waiting for `limit`, summed over requests.
    pub fn waited(&self, limit: Limit) -> Duration {
        Duration::from_nanos(self.shared.waited_nanos[Self::slot(limit)].load(Ordering::Relaxed))
    }

    fn slot(limit: Limit) -> usize {
        Limit::ALL.iter().position(|l| *l == limit).unwrap_or(0)
    }

    fn record_wait(&self, limit: Limit, waited: Duration) {
        if waited.is_zero() {
            return;
        }
        let nanos = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        self.shared.waited_nanos[Self::slot(limit)].fetch_add(nanos, Ordering::Relaxed);
        metrics::histogram!("blobsnap_limit_wait_seconds", "limit" => limit.as_str())
            .record(waited.as_secs_f64());
    }

    fn lock_window(&self) -> std::sync::MutexGuard<'_, Window> {
        // The window holds plain numbers; a panic elsewhere cannot leave them half-written.
        self.shared
            .window
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Pay `units` to the bucket of `limit` (no bucket: free).
    async fn pay(&self, limit: Limit, units: u64) {
        let rate = match limit {
            Limit::Upload => &self.shared.upload,
            Limit::Download => &self.shared.download,
            Limit::Requests => &self.shared.requests,
            Limit::Transfers => &None,
        };
        if let (Some(rate), true) = (rate, units > 0) {
            let waited = rate.take(units).await;
            self.record_wait(limit, waited);
        }
    }

    async fn acquire(&self) -> Result<Permit> {
        let started = Instant::now();
        let closed = |_| Error::new(ErrorKind::Cancelled, "the transfer budget was closed");
        let lane = if is_background() {
            Some(
                Arc::clone(&self.shared.background)
                    .acquire_owned()
                    .await
                    .map_err(closed)?,
            )
        } else {
            None
        };
        let (permit, urgent) = if is_urgent() {
            match Arc::clone(&self.shared.permits).try_acquire_owned() {
                Ok(p) => (p, false),
                Err(_) => {
                    metrics::counter!("blobsnap_urgent_transfers_total").increment(1);
                    let p = Arc::clone(&self.shared.urgent)
                        .acquire_owned()
                        .await
                        .map_err(closed)?;
                    (p, true)
                }
            }
        } else {
            let p = Arc::clone(&self.shared.permits)
                .acquire_owned()
                .await
                .map_err(closed)?;
            (p, false)
        };
        self.record_wait(Limit::Transfers, started.elapsed());
        let now = self.shared.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.shared.peak.fetch_max(now, Ordering::Relaxed);
        metrics::gauge!("blobsnap_transfers_in_flight").set(now as f64);
        Ok(Permit {
            permit: Some(permit),
            budget: self.clone(),
            urgent,
            _lane: lane,
        })
    }

    /// Feed a response into the AIMD window: a throttling error halves it (at most once per
    /// second), a success widens it by `1/window`.
    fn observe<T>(&self, outcome: &Result<T>) {
        match outcome {
            Err(e) if e.is_throttling() => self.narrow(),
            Err(_) => {}
            Ok(_) => self.widen(),
        }
    }

    fn narrow(&self) {
        self.shared.throttled.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("blobsnap_store_throttled_total").increment(1);
        let mut w = self.lock_window();
        let now = Instant::now();
        if w.last_cut
            .is_some_and(|t| now.duration_since(t) < CUT_AT_MOST_EVERY)
        {
            return;
        }
        w.last_cut = Some(now);
        w.size = (w.size / 2.0).floor().max(1.0);
        let target = w.size as usize;
        let mut open = self.shared.limits.transfers - w.withheld - w.owed;
        while open > target {
            match Arc::clone(&self.shared.permits).try_acquire_owned() {
                Ok(p) => {
                    p.forget();
                    w.withheld += 1;
                }
                Err(_) => w.owed += 1,
            }
            open -= 1;
        }
        metrics::gauge!("blobsnap_transfer_window").set(target as f64);
        tracing::info!(
            window = target,
            "the store asked to slow down: transfer window halved"
        );
    }

    fn widen(&self) {
        let mut w = self.lock_window();
        let max = self.shared.limits.transfers as f64;
        if w.size >= max {
            return;
        }
        w.size = (w.size + 1.0 / w.size).min(max);
        let target = w.size as usize;
        let mut open = self.shared.limits.transfers - w.withheld - w.owed;
        while open < target {
            if w.owed > 0 {
                w.owed -= 1;
            } else {
                w.withheld -= 1;
                self.shared.permits.add_permits(1);
            }
            open += 1;
        }
        metrics::gauge!("blobsnap_transfer_window").set(target as f64);
    }
}

/// One transfer's place in the budget, given back when dropped (or kept out, if the window
/// has narrowed since it was taken).
struct Permit {
    permit: Option<OwnedSemaphorePermit>,
    budget: Budget,
    /// Of the urgent lane (outside the AIMD window's accounting).
    urgent: bool,
    /// A background transfer's place in its lane.
    _lane: Option<OwnedSemaphorePermit>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let shared = &self.budget.shared;
        let now = shared.in_flight.fetch_sub(1, Ordering::Relaxed) - 1;
        metrics::gauge!("blobsnap_transfers_in_flight").set(now as f64);
        if self.urgent {
            return;
        }
        let mut w = self.budget.lock_window();
        if w.owed > 0 {
            if let Some(p) = self.permit.take() {
                p.forget();
                w.owed -= 1;
                w.withheld += 1;
            }
        }
    }
}

/// A store whose requests share one [`Budget`].
#[derive(Debug)]
pub struct LimitStore<S> {
    inner: S,
    budget: Budget,
}

impl<S: BlobStore> LimitStore<S> {
    /// `inner` with its requests limited by `budget` (clone the budget to share it).
    pub fn new(inner: S, budget: Budget) -> Self {
        LimitStore { inner, budget }
    }

    /// The budget.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }
}

impl<S: BlobStore> std::fmt::Display for LimitStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.inner, f)
    }
}

/// Keys one DeleteObjects request carries.
const DELETE_BATCH: usize = 1000;
/// Keys one listing page carries.
const LIST_PAGE: u64 = 1000;

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<S: BlobStore> BlobStore for LimitStore<S> {
    async fn capabilities(&self, probe: Probe) -> Result<Capabilities> {
        self.inner.capabilities(probe).await
    }

    async fn put(&self, key: &BlobKey, body: PutBody, opts: PutOptions) -> Result<PutResult> {
        self.budget.pay(Limit::Requests, 1).await;
        let _permit = self.budget.acquire().await?;
        self.budget.pay(Limit::Upload, body.len()).await;
        let put = self.inner.put(key, body, opts).await;
        self.budget.observe(&put);
        if let Ok(r) = &put {
            // A multipart upload's parts and completion, paid after the fact.
            self.budget
                .pay(Limit::Requests, u64::from(r.requests.saturating_sub(1)))
                .await;
        }
        put
    }

    async fn get(&self, key: &BlobKey, range: Option<Range<u64>>) -> Result<GetResult> {
        self.budget.pay(Limit::Requests, 1).await;
        let permit = self.budget.acquire().await?;
        let got = self.inner.get(key, range).await;
        self.budget.observe(&got);
        let mut got = got?;
        // The permit goes with the body (released when the body ends or is dropped), and each
        // chunk is paid for before it is handed on.
        let body = std::mem::replace(&mut got.body, futures::stream::empty().boxed());
        let budget = self.budget.clone();
        got.body = futures::stream::unfold(
            (body, permit, budget),
            |(mut body, permit, budget)| async move {
                let chunk = body.next().await?;
                if let Ok(bytes) = &chunk {
                    budget.pay(Limit::Download, bytes.len() as u64).await;
                }
                Some((chunk, (body, permit, budget)))
            },
        )
        .boxed();
        Ok(got)
    }

    async fn head(&self, key: &BlobKey) -> Result<ObjectMeta> {
        self.budget.pay(Limit::Requests, 1).await;
        let _permit = self.budget.acquire().await?;
        let head = self.inner.head(key).await;
        self.budget.observe(&head);
        head
    }

    async fn delete_many(&self, keys: &[BlobKey]) -> Result<DeleteFailures> {
        let requests = keys.len().div_ceil(DELETE_BATCH).max(1) as u64;
        self.budget.pay(Limit::Requests, requests).await;
        let _permit = self.budget.acquire().await?;
        let deleted = self.inner.delete_many(keys).await;
        self.budget.observe(&deleted);
        deleted
    }

    fn list<'a>(&'a self, scope: &Scope) -> BoxStream<'a, Result<ObjectMeta>> {
        let budget = self.budget.clone();
        let mut seen = 0u64;
        self.inner
            .list(scope)
            .then(move |item| {
                let pay = seen.is_multiple_of(LIST_PAGE);
                seen += 1;
                let budget = budget.clone();
                async move {
                    if pay {
                        budget.pay(Limit::Requests, 1).await;
                    }
                    item
                }
            })
            .boxed()
    }

    async fn incomplete_uploads(&self, scope: &Scope, before: Option<SystemTime>) -> Uploads {
        self.budget.pay(Limit::Requests, 1).await;
        self.inner.incomplete_uploads(scope, before).await
    }
}

#[cfg(test)]
mod tests;
