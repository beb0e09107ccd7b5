//! A fault-injecting [`BlobStore`] wrapper, for reliability tests.
//!
//! With a seeded RNG it injects, per call: a `Transient` error *before* the call reaches the
//! inner store (`error_rate`, per operation); a `Transient` error *after* a put succeeded (`ambiguous_rate`:
//! the object is stored but the caller is told it failed, as when a response is lost); a
//! truncated body on gets (`truncate_rate`: the stream ends early, or fails midway); and fixed
//! latency. Faults can be switched off and on while the store is in use.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::StreamExt as _;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};

use super::{
    BlobKey, BlobStore, Capabilities, DeleteFailures, GetResult, ObjectMeta, Probe, PutBody,
    PutOptions, PutResult, Scope, Uploads,
};
use crate::error::{Error, Result};

/// Per-operation probabilities.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OpRates {
    /// `put`.
    pub put: f64,
    /// `get`.
    pub get: f64,
    /// `head`.
    pub head: f64,
    /// `delete_many`.
    pub delete: f64,
    /// `list` (the listing fails after its first item, as a broken second page would).
    pub list: f64,
    /// `incomplete_uploads`.
    pub multipart: f64,
}

impl OpRates {
    /// The same probability for every operation.
    pub fn all(p: f64) -> Self {
        OpRates {
            put: p,
            get: p,
            head: p,
            delete: p,
            list: p,
            multipart: p,
        }
    }
}

/// What to inject.
#[derive(Clone, Copy, Debug, Default)]
pub struct FaultConfig {
    /// Per operation, the probability that a call fails with `Transient` before reaching the
    /// store.
    pub error_rate: OpRates,
    /// Probability that a successful put is reported as a `Transient` failure.
    pub ambiguous_rate: f64,
    /// Probability that a get's body is cut short.
    pub truncate_rate: f64,
    /// Latency added to every call.
    pub latency: Duration,
    /// RNG seed (runs with the same seed and call order inject the same faults).
    pub seed: u64,
    /// Injected errors are throttling responses (as S3's `503 SlowDown`,
    /// [`Error::is_throttling`]), not plain transient faults.
    pub throttle: bool,
}

/// The fault-injecting wrapper.
#[derive(Debug)]
pub struct FaultStore<S> {
    inner: S,
    config: FaultConfig,
    rng: Mutex<StdRng>,
    enabled: AtomicBool,
    injected: AtomicU64,
}

impl<S: BlobStore> FaultStore<S> {
    /// Wrap `inner`.
    pub fn new(inner: S, config: FaultConfig) -> Self {
        FaultStore {
            inner,
            rng: Mutex::new(StdRng::seed_from_u64(config.seed)),
            config,
            enabled: AtomicBool::new(true),
            injected: AtomicU64::new(0),
        }
    }

    /// Switch injection on or off.
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::SeqCst);
    }

    /// Faults injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::SeqCst)
    }

    fn roll(&self, p: f64) -> bool {
        if p <= 0.0 || !self.enabled.load(Ordering::SeqCst) {
            return false;
        }
        let hit = match self.rng.lock() {
            Ok(mut rng) => rng.random::<f64>() < p,
            Err(_) => false,
        };
        if hit {
            self.injected.fetch_add(1, Ordering::SeqCst);
        }
        hit
    }

    async fn before(
        &self,
        op: &str,
        rate: f64,
        key: &(dyn std::fmt::Display + Sync),
    ) -> Result<()> {
        if !self.config.latency.is_zero() {
            tokio::time::sleep(self.config.latency).await;
        }
        if self.roll(rate) {
            let e = Error::transient(format!("injected fault: {op} {key}"));
            return Err(if self.config.throttle {
                e.throttling()
            } else {
                e
            });
        }
        Ok(())
    }
}

impl<S: BlobStore> std::fmt::Display for FaultStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "faulty {}", self.inner)
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<S: BlobStore> BlobStore for FaultStore<S> {
    async fn capabilities(&self, probe: Probe) -> Result<Capabilities> {
        self.inner.capabilities(probe).await
    }

    async fn put(&self, key: &BlobKey, body: PutBody, opts: PutOptions) -> Result<PutResult> {
        self.before("put", self.config.error_rate.put, key).await?;
        let r = self.inner.put(key, body, opts).await?;
        if self.roll(self.config.ambiguous_rate) {
            return Err(Error::transient(format!(
                "injected fault after a successful put of {key} (response lost)"
            )));
        }
        Ok(r)
    }

    async fn get(&self, key: &BlobKey, range: Option<Range<u64>>) -> Result<GetResult> {
        self.before("get", self.config.error_rate.get, key).await?;
        let mut got = self.inner.get(key, range).await?;
        let len = got.range.end - got.range.start;
        if len > 0 && self.roll(self.config.truncate_rate) {
            let keep = match self.rng.lock() {
                Ok(mut rng) => rng.random_range(0..len),
                Err(_) => 0,
            };
            let fail_midway = keep % 2 == 0;
            let key = key.clone();
            let mut seen = 0u64;
            got.body = got
                .body
                .map(move |chunk| {
                    let chunk = chunk?;
                    let room = keep.saturating_sub(seen);
                    seen += chunk.len() as u64;
                    Ok(chunk.slice(..(room.min(chunk.len() as u64) as usize)))
                })
                .take_while(|c: &Result<bytes::Bytes>| {
                    futures::future::ready(c.as_ref().map(|b| !b.is_empty()).unwrap_or(true))
                })
                .chain(futures::stream::iter(fail_midway.then(move || {
                    Err(Error::transient(format!(
                        "injected fault: body of {key} cut"
                    )))
                })))
                .boxed();
        }
        Ok(got)
    }

    async fn head(&self, key: &BlobKey) -> Result<ObjectMeta> {
        self.before("head", self.config.error_rate.head, key)
            .await?;
        self.inner.head(key).await
    }

    async fn delete_many(&self, keys: &[BlobKey]) -> Result<DeleteFailures> {
        self.before("delete", self.config.error_rate.delete, &keys.len())
            .await?;
        self.inner.delete_many(keys).await
    }

    fn list<'a>(&'a self, scope: &Scope) -> BoxStream<'a, Result<ObjectMeta>> {
        let fail = self.roll(self.config.error_rate.list);
        let scope2 = scope.clone();
        let inner = self.inner.list(scope);
        if fail {
            // Fail after the first item, as a broken second page would.
            return inner
                .take(1)
                .chain(futures::stream::once(async move {
                    Err(Error::transient(format!("injected fault: list {scope2}")))
                }))
                .boxed();
        }
        inner
    }

    async fn incomplete_uploads(&self, scope: &Scope, before: Option<SystemTime>) -> Uploads {
        self.before(
            "incomplete uploads",
            self.config.error_rate.multipart,
            scope,
        )
        .await?;
        self.inner.incomplete_uploads(scope, before).await
    }
}
