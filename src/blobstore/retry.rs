//! The retry layer: the one retry loop of the process (the S3 SDK's own retries are off).
//!
//! Only `Transient` errors are retried, with exponential backoff, full jitter and a total time
//! budget per operation; every other kind returns at once, unchanged (context is added
//! outside the loop, so wrapping never hides the kind — Samza's §6.5 bug).
//!
//! **Ambiguous create-only puts.** A create-only put that failed transiently may still have
//! been stored (the response was lost). If a retry then gets `Conflict`, the layer reads the
//! object back and compares its SHA-256 with the body's: equal means the earlier attempt won
//! and the put succeeded; different means another writer won, and `Conflict` stands. Callers
//! that need to tell two writers of the *same* bytes apart put a nonce in the body (the
//! checkpoint store does).
//!
//! Listing restarts after a transient failure and skips the keys already yielded (listings
//! are in key order). A body that fails midway is not retried here: whole-object reads retry
//! through [`retry`] around the read.

use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::{StreamExt as _, TryStreamExt as _};
use serde::{Deserialize, Serialize};

use super::{
    BlobKey, BlobStore, Capabilities, DeleteFailures, GetResult, ObjectMeta, Probe, PutBody,
    PutMode, PutOptions, PutResult, Scope, Uploads,
};
use crate::digest::{hash_file, Sha256};
use crate::error::{Error, ErrorKind, Result};

/// Backoff schedule and budget.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct RetryPolicy {
    /// Delay before the first retry, ms.
    #[serde(deserialize_with = "crate::units::millis")]
    pub initial_delay_ms: u64,
    /// Growth factor of the delay.
    pub factor: f64,
    /// Largest delay, ms.
    #[serde(deserialize_with = "crate::units::millis")]
    pub max_delay_ms: u64,
    /// Total time budget of one operation, ms (attempts stop once it is spent).
    #[serde(deserialize_with = "crate::units::millis")]
    pub budget_ms: u64,
    /// Most attempts (0: bounded by the budget only).
    pub max_attempts: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            initial_delay_ms: 100,
            factor: 2.0,
            max_delay_ms: 10_000,
            budget_ms: 120_000,
            max_attempts: 0,
        }
    }
}

impl RetryPolicy {
    /// The upper bound of the delay before retry number `retry` (1-based); the actual delay is
    /// uniform in `[bound/2, bound]` (jitter).
    pub fn delay_bound(&self, retry: u32) -> Duration {
        let exp = self
            .factor
            .max(1.0)
            .powi(retry.saturating_sub(1).min(60) as i32);
        let ms = (self.initial_delay_ms as f64 * exp).min(self.max_delay_ms as f64);
        Duration::from_millis(ms as u64)
    }

    fn jittered(&self, retry: u32) -> Duration {
        let bound = self.delay_bound(retry);
        let half = bound / 2;
        half + bound.mul_f64(rand::random::<f64>() * 0.5)
    }
}

/// Tell the operator, at most every [`NOTICE_EVERY`] for the whole process, that an operation
/// keeps failing transiently and until when it is retried: a server that does not answer (a
/// dead endpoint, a refused connection) is reported within about a second, not when the
/// budget is spent. Quiet for the first two attempts, which a routine throttle or a dropped
/// connection ends.
fn notice_retrying(
    policy: &RetryPolicy,
    what: &dyn std::fmt::Display,
    attempt: u32,
    start: tokio::time::Instant,
    e: &Error,
) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    static BASE: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    if attempt < 3 {
        return;
    }
    let now = BASE
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
        + 1;
    let last = LAST.load(Ordering::Relaxed);
    if last != 0 && now < last + NOTICE_EVERY.as_millis() as u64 {
        return;
    }
    if LAST
        .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
        .is_err()
    {
        return;
    }
    let left = Duration::from_millis(policy.budget_ms).saturating_sub(start.elapsed());
    // Wall-clock time for the operator (the message only; nothing decides by it).
    let now = crate::units::Clock::now_millis(&crate::units::SystemClock);
    let until = crate::units::utc(now.saturating_add(left.as_millis() as u64));
    tracing::warn!(
        "{what}: attempt {attempt} failed ({e}); retrying until {until} ({}s of the {}s retry budget left)",
        left.as_secs(),
        policy.budget_ms / 1000
    );
}

/// How often [`notice_retrying`] speaks at most.
const NOTICE_EVERY: Duration = Duration::from_secs(15);

/// Run `op` until it succeeds, fails with a non-transient error, or the policy's budget or
/// attempt limit is spent. The error that ends the loop gets an "after N attempts" context.
pub async fn retry<T, F, Fut>(policy: &RetryPolicy, what: &str, mut op: F) -> Result<T>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let start = tokio::time::Instant::now();
    let budget = Duration::from_millis(policy.budget_ms);
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        match op(attempt).await {
            Ok(v) => return Ok(v),
            Err(e) if e.kind() != ErrorKind::Transient => return Err(e),
            Err(e) => {
                let delay = policy.jittered(attempt);
                let out_of_attempts = policy.max_attempts != 0 && attempt >= policy.max_attempts;
                if out_of_attempts || start.elapsed() + delay > budget {
                    return Err(e.context(format!(
                        "{what}: gave up after {attempt} attempts in {:.1}s",
                        start.elapsed().as_secs_f64()
                    )));
                }
                tracing::debug!(what, attempt, delay_ms = delay.as_millis() as u64, error = %e, "retrying");
                notice_retrying(policy, &what, attempt, start, &e);
                metrics::counter!("blobsnap_store_retries_total").increment(1);
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// A [`BlobStore`] wrapper that retries transient failures.
#[derive(Debug)]
pub struct RetryStore<S> {
    inner: S,
    policy: RetryPolicy,
}

impl<S: BlobStore> RetryStore<S> {
    /// Wrap `inner` with `policy`.
    pub fn new(inner: S, policy: RetryPolicy) -> Self {
        RetryStore { inner, policy }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Sleep before retry number `attempt`, or return false if the policy's attempts or
    /// budget are spent.
    async fn backoff(&self, attempt: u32, start: tokio::time::Instant) -> bool {
        let delay = self.policy.jittered(attempt);
        let out = self.policy.max_attempts != 0 && attempt >= self.policy.max_attempts;
        if out || start.elapsed() + delay > Duration::from_millis(self.policy.budget_ms) {
            return false;
        }
        metrics::counter!("blobsnap_store_retries_total").increment(1);
        tokio::time::sleep(delay).await;
        true
    }

    /// Settle an ambiguous create-only put that ended in `Conflict`: did our earlier attempt
    /// store exactly these bytes?
    async fn read_back_matches(&self, key: &BlobKey, sha: Sha256, len: u64) -> Result<bool> {
        let meta = self.head(key).await?;
        if meta.size != len {
            return Ok(false);
        }
        // Streamed and hashed, never buffered: the object may be a multipart blob of GiBs.
        let (got, size) = retry(&self.policy, "read back", |_| {
            super::hash_object(&self.inner, key)
        })
        .await?;
        Ok(got == sha && size == len)
    }
}

impl<S: BlobStore> std::fmt::Display for RetryStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.inner, f)
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<S: BlobStore> BlobStore for RetryStore<S> {
    async fn capabilities(&self, probe: Probe) -> Result<Capabilities> {
        retry(&self.policy, "probe capabilities", |_| {
            self.inner.capabilities(probe)
        })
        .await
    }

    async fn put(&self, key: &BlobKey, body: PutBody, mut opts: PutOptions) -> Result<PutResult> {
        if opts.mode == PutMode::CreateOnly && opts.sha256.is_none() {
            // Needed to settle an ambiguous outcome by reading back.
            opts.sha256 = Some(match &body {
                PutBody::Bytes(b) => Sha256::of(b),
                PutBody::File { path, .. } => {
                    let p = path.clone();
                    tokio::task::spawn_blocking(move || hash_file(&p))
                        .await
                        .map_err(|e| Error::task("hash", e))??
                        .sha256
                }
            });
        }
        let start = tokio::time::Instant::now();
        let mut ambiguous = false;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            match self.inner.put(key, body.clone(), opts).await {
                Ok(v) => return Ok(v),
                Err(e) if e.kind() == ErrorKind::Conflict && ambiguous => {
                    let (Some(sha), len) = (opts.sha256, body.len()) else {
                        return Err(e);
                    };
                    return match self.read_back_matches(key, sha, len).await {
                        Ok(true) => {
                            tracing::info!(%key, attempt, "ambiguous create-only put settled by read-back: ours");
                            Ok(PutResult {
                                size: len,
                                e_tag: None,
                                requests: attempt,
                            })
                        }
                        Ok(false) => Err(e.context("read back: another writer's object")),
                        Err(re) => Err(e.context(format!("read back failed: {re}"))),
                    };
                }
                Err(e) if e.kind() != ErrorKind::Transient => return Err(e),
                Err(e) => {
                    ambiguous = true;
                    notice_retrying(&self.policy, &format_args!("put {key}"), attempt, start, &e);
                    if !self.backoff(attempt, start).await {
                        return Err(
                            e.context(format!("put {key}: gave up after {attempt} attempts"))
                        );
                    }
                }
            }
        }
    }

    async fn get(&self, key: &BlobKey, range: Option<Range<u64>>) -> Result<GetResult> {
        retry(&self.policy, &format!("get {key}"), |_| {
            self.inner.get(key, range.clone())
        })
        .await
    }

    async fn head(&self, key: &BlobKey) -> Result<ObjectMeta> {
        retry(&self.policy, &format!("head {key}"), |_| {
            self.inner.head(key)
        })
        .await
    }

    async fn delete_many(&self, keys: &[BlobKey]) -> Result<DeleteFailures> {
        let start = tokio::time::Instant::now();
        let mut pending = keys.to_vec();
        let mut done_failures: DeleteFailures = Vec::new();
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let failures = match self.inner.delete_many(&pending).await {
                Ok(f) => f,
                Err(e) if !e.is_transient() => return Err(e),
                Err(e) => {
                    notice_retrying(
                        &self.policy,
                        &format_args!("delete {} keys", pending.len()),
                        attempt,
                        start,
                        &e,
                    );
                    if !self.backoff(attempt, start).await {
                        return Err(e.context(format!(
                            "delete {} keys: gave up after {attempt} attempts",
                            pending.len()
                        )));
                    }
                    continue;
                }
            };
            let (transient, other): (DeleteFailures, DeleteFailures) =
                failures.into_iter().partition(|(_, e)| e.is_transient());
            done_failures.extend(other);
            if transient.is_empty() {
                return Ok(done_failures);
            }
            if !self.backoff(attempt, start).await {
                done_failures.extend(transient);
                return Ok(done_failures);
            }
            pending = transient.into_iter().map(|(k, _)| k).collect();
        }
    }

    fn list<'a>(&'a self, scope: &Scope) -> BoxStream<'a, Result<ObjectMeta>> {
        struct State<'a> {
            stream: BoxStream<'a, Result<ObjectMeta>>,
            last: Option<BlobKey>,
            failures: u32,
            started: tokio::time::Instant,
        }
        let scope = scope.clone();
        let name = match scope.to_string() {
            s if s.is_empty() => "the whole store".to_string(),
            s => s,
        };
        let policy = self.policy;
        let state = State {
            stream: self.inner.list(&scope),
            last: None,
            failures: 0,
            started: tokio::time::Instant::now(),
        };
        futures::stream::try_unfold(state, move |mut st| {
            let (scope, name) = (scope.clone(), name.clone());
            async move {
                loop {
                    match st.stream.next().await {
                        None => return Ok(None),
                        Some(Ok(meta)) => {
                            if st.last.as_ref().is_some_and(|l| meta.key <= *l) {
                                continue; // already yielded before a restart
                            }
                            st.last = Some(meta.key.clone());
                            return Ok(Some((meta, st)));
                        }
                        Some(Err(e)) if e.is_transient() => {
                            st.failures += 1;
                            let delay = policy.jittered(st.failures);
                            let out =
                                policy.max_attempts != 0 && st.failures >= policy.max_attempts;
                            if out
                                || st.started.elapsed() + delay
                                    > Duration::from_millis(policy.budget_ms)
                            {
                                return Err(e.context(format!(
                                    "list {name}: gave up after {} failures",
                                    st.failures
                                )));
                            }
                            notice_retrying(
                                &policy,
                                &format_args!("list {name}"),
                                st.failures,
                                st.started,
                                &e,
                            );
                            tokio::time::sleep(delay).await;
                            st.stream = self.inner.list(&scope);
                        }
                        Some(Err(e)) => return Err(e),
                    }
                }
            }
        })
        .into_stream()
        .boxed()
    }

    async fn incomplete_uploads(&self, scope: &Scope, before: Option<SystemTime>) -> Uploads {
        // Idempotent as a whole: a retry lists again and aborts what is left.
        retry(&self.policy, &format!("incomplete uploads {scope}"), |_| {
            self.inner.incomplete_uploads(scope, before)
        })
        .await
    }
}

/// Share one wrapped store.
pub type SharedStore = Arc<dyn BlobStore>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_bounds_grow_and_cap() {
        let p = RetryPolicy::default();
        assert_eq!(p.delay_bound(1), Duration::from_millis(100));
        assert_eq!(p.delay_bound(2), Duration::from_millis(200));
        assert_eq!(p.delay_bound(4), Duration::from_millis(800));
        assert_eq!(p.delay_bound(30), Duration::from_millis(10_000));
        for _ in 0..100 {
            let d = p.jittered(3);
            assert!(d >= Duration::from_millis(200) && d <= Duration::from_millis(400));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn only_transient_errors_are_retried_within_budget() {
        let policy = RetryPolicy {
            budget_ms: 5_000,
            ..Default::default()
        };
        let mut calls = 0;
        let r: Result<()> = retry(&policy, "op", |_| {
            calls += 1;
            async { Err(Error::permanent("403")) }
        })
        .await;
        assert_eq!(r.unwrap_err().kind(), ErrorKind::Permanent);
        assert_eq!(calls, 1);

        let mut calls = 0;
        let r: Result<u32> = retry(&policy, "op", |n| {
            calls += 1;
            async move {
                if n < 4 {
                    Err(Error::transient("503"))
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        assert_eq!(r.unwrap(), 4);
        assert_eq!(calls, 4);

        let start = tokio::time::Instant::now();
        let r: Result<()> = retry(&policy, "op", |_| async { Err(Error::transient("503")) }).await;
        let e = r.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Transient);
        assert!(e.to_string().contains("gave up after"), "{e}");
        assert!(start.elapsed() <= Duration::from_millis(5_000));
    }

    /// The attempts of a store operation that keeps failing transiently, through the store
    /// stack (the retry loop `RetryStore` runs, over counting, over fault injection failing
    /// every request), on the paused (injected) clock: each gap lies within its jittered bound, the bounds follow the
    /// schedule, the attempts stop exactly when the next delay would overrun the budget, and
    /// the counting layer saw one request per attempt.
    #[tokio::test(start_paused = true)]
    async fn attempts_and_their_spacing_follow_the_backoff_schedule() {
        use super::super::local::LocalStore;
        use crate::blobstore::counting::CountingStore;
        use crate::blobstore::fault::{FaultConfig, FaultStore, OpRates};
        let tmp = tempfile_dir();
        let policy = RetryPolicy {
            initial_delay_ms: 100,
            factor: 2.0,
            max_delay_ms: 1_600,
            budget_ms: 10_000,
            max_attempts: 0,
        };
        let faulty = FaultStore::new(
            LocalStore::new(&tmp).unwrap(),
            FaultConfig {
                error_rate: OpRates {
                    head: 1.0,
                    ..Default::default()
                },
                ..Default::default()
            },
        );
        let counting = CountingStore::new(faulty);
        let counters = counting.counters();
        let store = RetryStore::new(counting, policy);
        let times = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let key = BlobKey::new("a/b").unwrap();
        let start = tokio::time::Instant::now();
        // Observe each attempt's time through a spy around the store.
        let t = std::sync::Arc::clone(&times);
        let r = retry(&policy, "head", |_| {
            t.lock().unwrap().push(tokio::time::Instant::now());
            store.inner().head(&key)
        })
        .await;
        assert_eq!(r.unwrap_err().kind(), ErrorKind::Transient);
        let times = times.lock().unwrap().clone();
        let mut elapsed = Duration::ZERO;
        for (i, w) in times.windows(2).enumerate() {
            let gap = w[1] - w[0];
            let bound = policy.delay_bound(i as u32 + 1);
            assert!(
                gap >= bound / 2 && gap <= bound,
                "retry {}: waited {gap:?}, bound {bound:?}",
                i + 1
            );
            elapsed += gap;
        }
        assert_eq!(times[0], start, "the first attempt is immediate");
        // Stopped because the next delay could overrun the budget, not before.
        let next_min = policy.delay_bound(times.len() as u32) / 2;
        assert!(elapsed <= Duration::from_millis(policy.budget_ms));
        assert!(
            elapsed + policy.delay_bound(times.len() as u32)
                > Duration::from_millis(policy.budget_ms),
            "gave up early: {elapsed:?} spent, next delay at least {next_min:?}"
        );
        // The schedule: 100, 200, 400, 800, 1600, 1600, ... ms bounds.
        assert_eq!(policy.delay_bound(5), Duration::from_millis(1_600));
        assert_eq!(policy.delay_bound(9), Duration::from_millis(1_600));
        assert!(times.len() >= 8, "{} attempts in 10 s", times.len());
        // One request per attempt, all failed, as the counting layer saw them.
        let head = counters.snapshot().head;
        assert_eq!(head.calls, times.len() as u64);
        assert_eq!(head.errors, times.len() as u64);
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("blobsnap-retry-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
