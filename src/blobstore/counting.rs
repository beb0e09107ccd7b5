//! A [`BlobStore`] wrapper that counts requests, failures and bytes per operation.
//!
//! Tests assert through it ("the second upload sent only the new SSTs", "a restore fetched
//! exactly the missing bytes"); the runtime exports the same counters as metrics.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::StreamExt as _;

use super::{
    BlobKey, BlobStore, Capabilities, DeleteFailures, GetResult, ObjectMeta, Probe, PutBody,
    PutOptions, PutResult, Scope, Uploads,
};
use crate::error::Result;

/// Counters of one operation kind.
#[derive(Debug, Default)]
pub struct OpCounters {
    calls: AtomicU64,
    errors: AtomicU64,
    bytes: AtomicU64,
    requests: AtomicU64,
}

/// A point-in-time copy of [`OpCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpCount {
    /// Calls of the trait method.
    pub calls: u64,
    /// Calls that returned an error (for gets: also bodies that failed midway).
    pub errors: u64,
    /// Payload bytes sent (puts) or received (gets).
    pub bytes: u64,
    /// Requests on the wire as the store reports them (a multipart put is parts + 2).
    pub requests: u64,
}

impl OpCounters {
    fn snapshot(&self) -> OpCount {
        OpCount {
            calls: self.calls.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
        }
    }
}

/// All counters of a [`CountingStore`]; clone the `Arc` to read them while the store is in use.
#[derive(Debug, Default)]
pub struct Counters {
    /// Puts.
    pub put: OpCounters,
    /// Gets (bytes: body bytes received).
    pub get: OpCounters,
    /// Heads.
    pub head: OpCounters,
    /// Batch deletes (bytes unused; requests: keys asked to delete).
    pub delete: OpCounters,
    /// Listings (requests: objects listed).
    pub list: OpCounters,
    /// Multipart listings and aborts.
    pub multipart: OpCounters,
}

/// A snapshot of all counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CountSnapshot {
    /// Puts.
    pub put: OpCount,
    /// Gets.
    pub get: OpCount,
    /// Heads.
    pub head: OpCount,
    /// Batch deletes.
    pub delete: OpCount,
    /// Listings.
    pub list: OpCount,
    /// Multipart listings and aborts.
    pub multipart: OpCount,
}

impl Counters {
    /// Read every counter.
    pub fn snapshot(&self) -> CountSnapshot {
        CountSnapshot {
            put: self.put.snapshot(),
            get: self.get.snapshot(),
            head: self.head.snapshot(),
            delete: self.delete.snapshot(),
            list: self.list.snapshot(),
            multipart: self.multipart.snapshot(),
        }
    }
}

impl CountSnapshot {
    /// Counts since `earlier`.
    pub fn since(&self, earlier: &CountSnapshot) -> CountSnapshot {
        fn d(a: OpCount, b: OpCount) -> OpCount {
            OpCount {
                calls: a.calls - b.calls,
                errors: a.errors - b.errors,
                bytes: a.bytes - b.bytes,
                requests: a.requests - b.requests,
            }
        }
        CountSnapshot {
            put: d(self.put, earlier.put),
            get: d(self.get, earlier.get),
            head: d(self.head, earlier.head),
            delete: d(self.delete, earlier.delete),
            list: d(self.list, earlier.list),
            multipart: d(self.multipart, earlier.multipart),
        }
    }
}

/// A [`BlobStore`] wrapper that counts what passes through it.
#[derive(Debug)]
pub struct CountingStore<S> {
    inner: S,
    counters: Arc<Counters>,
}

impl<S: BlobStore> CountingStore<S> {
    /// Wrap `inner`.
    pub fn new(inner: S) -> Self {
        CountingStore {
            inner,
            counters: Arc::default(),
        }
    }

    /// The live counters.
    pub fn counters(&self) -> Arc<Counters> {
        Arc::clone(&self.counters)
    }
}

impl<S: BlobStore> std::fmt::Display for CountingStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.inner, f)
    }
}

/// Count a call, and publish it as `blobsnap_store_requests_total{op, outcome}` through the
/// `metrics` facade (outcome: `ok` or the error kind).
fn count<T>(op: &'static str, c: &OpCounters, r: &Result<T>) {
    c.calls.fetch_add(1, Ordering::Relaxed);
    let outcome = match r {
        Ok(_) => "ok",
        Err(e) => {
            c.errors.fetch_add(1, Ordering::Relaxed);
            e.kind().as_str()
        }
    };
    metrics::counter!("blobsnap_store_requests_total", "op" => op, "outcome" => outcome)
        .increment(1);
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<S: BlobStore> BlobStore for CountingStore<S> {
    async fn capabilities(&self, probe: Probe) -> Result<Capabilities> {
        self.inner.capabilities(probe).await
    }

    async fn put(&self, key: &BlobKey, body: PutBody, opts: PutOptions) -> Result<PutResult> {
        let len = body.len();
        let r = self.inner.put(key, body, opts).await;
        count("put", &self.counters.put, &r);
        if let Ok(p) = &r {
            self.counters.put.bytes.fetch_add(len, Ordering::Relaxed);
            self.counters
                .put
                .requests
                .fetch_add(u64::from(p.requests), Ordering::Relaxed);
        }
        r
    }

    async fn get(&self, key: &BlobKey, range: Option<Range<u64>>) -> Result<GetResult> {
        let r = self.inner.get(key, range).await;
        count("get", &self.counters.get, &r);
        let mut got = r?;
        self.counters.get.requests.fetch_add(1, Ordering::Relaxed);
        let counters = Arc::clone(&self.counters);
        got.body = got
            .body
            .inspect(move |chunk| match chunk {
                Ok(b) => {
                    counters
                        .get
                        .bytes
                        .fetch_add(b.len() as u64, Ordering::Relaxed);
                }
                Err(_) => {
                    counters.get.errors.fetch_add(1, Ordering::Relaxed);
                }
            })
            .boxed();
        Ok(got)
    }

    async fn head(&self, key: &BlobKey) -> Result<ObjectMeta> {
        let r = self.inner.head(key).await;
        count("head", &self.counters.head, &r);
        self.counters.head.requests.fetch_add(1, Ordering::Relaxed);
        r
    }

    async fn delete_many(&self, keys: &[BlobKey]) -> Result<DeleteFailures> {
        let r = self.inner.delete_many(keys).await;
        count("delete", &self.counters.delete, &r);
        self.counters
            .delete
            .requests
            .fetch_add(keys.len() as u64, Ordering::Relaxed);
        r
    }

    fn list<'a>(&'a self, scope: &Scope) -> BoxStream<'a, Result<ObjectMeta>> {
        self.counters.list.calls.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("blobsnap_store_requests_total", "op" => "list", "outcome" => "started")
            .increment(1);
        let counters = Arc::clone(&self.counters);
        self.inner
            .list(scope)
            .inspect(move |item| match item {
                Ok(_) => {
                    counters.list.requests.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {
                    counters.list.errors.fetch_add(1, Ordering::Relaxed);
                }
            })
            .boxed()
    }

    async fn incomplete_uploads(&self, scope: &Scope, before: Option<SystemTime>) -> Uploads {
        let r = self.inner.incomplete_uploads(scope, before).await;
        count("uploads", &self.counters.multipart, &r);
        r
    }
}
