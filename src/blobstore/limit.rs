//! One transfer budget for every task and store of a process: [`LimitStore`] makes each PUT,
//! GET, HEAD and batch delete wait for a permit of one [`Budget`], and a GET keeps its permit
//! until its body has been read to the end or dropped (a permit bounds what is on the wire,
//! not how long a request took to start). Listings and multipart bookkeeping are small and
//! not limited, so a consumer that reads objects while it lists cannot wait on itself.
//!
//! The layer sits under the retry layer (`Retry(Limit(Counting(store)))`, as
//! [`crate::config::Settings::open_store`] builds it): a request waiting out a backoff holds
//! no permit. A multipart PUT is one permit; its parts are bounded by the S3 store's own
//! `max-parts-in-flight`.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::StreamExt as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{
    BlobKey, BlobStore, Capabilities, DeleteFailures, GetResult, MultipartUpload, ObjectMeta,
    Probe, PutBody, PutOptions, PutResult, Scope,
};
use crate::error::{Error, ErrorKind, Result};

/// A number of transfers that may be in flight at once, shared by every clone.
#[derive(Clone, Debug)]
pub struct Budget {
    permits: Arc<Semaphore>,
    size: usize,
    in_flight: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
}

impl Budget {
    /// A budget of `size` transfers at once (at least 1).
    pub fn new(size: usize) -> Self {
        let size = size.max(1);
        Budget {
            permits: Arc::new(Semaphore::new(size)),
            size,
            in_flight: Arc::default(),
            peak: Arc::default(),
        }
    }

    /// Transfers allowed at once.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Transfers holding a permit now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// The most transfers that held a permit at once since the budget was made.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    async fn acquire(&self) -> Result<Permit> {
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .map_err(|_| Error::new(ErrorKind::Cancelled, "the transfer budget was closed"))?;
        let now = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak.fetch_max(now, Ordering::Relaxed);
        metrics::gauge!("blobsnap_transfers_in_flight").set(now as f64);
        Ok(Permit {
            _permit: permit,
            in_flight: Arc::clone(&self.in_flight),
        })
    }
}

/// One transfer's place in the budget, given back when dropped.
struct Permit {
    _permit: OwnedSemaphorePermit,
    in_flight: Arc<AtomicUsize>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let now = self.in_flight.fetch_sub(1, Ordering::Relaxed) - 1;
        metrics::gauge!("blobsnap_transfers_in_flight").set(now as f64);
    }
}

/// A store whose transfers share one [`Budget`].
#[derive(Debug)]
pub struct LimitStore<S> {
    inner: S,
    budget: Budget,
}

impl<S: BlobStore> LimitStore<S> {
    /// `inner` with its transfers limited by `budget` (clone the budget to share it).
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

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<S: BlobStore> BlobStore for LimitStore<S> {
    async fn capabilities(&self, probe: Probe) -> Result<Capabilities> {
        self.inner.capabilities(probe).await
    }

    async fn put(&self, key: &BlobKey, body: PutBody, opts: PutOptions) -> Result<PutResult> {
        let _permit = self.budget.acquire().await?;
        self.inner.put(key, body, opts).await
    }

    async fn get(&self, key: &BlobKey, range: Option<Range<u64>>) -> Result<GetResult> {
        let permit = self.budget.acquire().await?;
        let mut got = self.inner.get(key, range).await?;
        // The permit goes with the body: released when the body ends or is dropped.
        let body = std::mem::replace(&mut got.body, futures::stream::empty().boxed());
        got.body = futures::stream::unfold((body, permit), |(mut body, permit)| async move {
            let chunk = body.next().await?;
            Some((chunk, (body, permit)))
        })
        .boxed();
        Ok(got)
    }

    async fn head(&self, key: &BlobKey) -> Result<ObjectMeta> {
        let _permit = self.budget.acquire().await?;
        self.inner.head(key).await
    }

    async fn delete_many(&self, keys: &[BlobKey]) -> Result<DeleteFailures> {
        let _permit = self.budget.acquire().await?;
        self.inner.delete_many(keys).await
    }

    fn list<'a>(&'a self, scope: &Scope) -> BoxStream<'a, Result<ObjectMeta>> {
        self.inner.list(scope)
    }

    async fn incomplete_uploads(
        &self,
        scope: &Scope,
        abort_before: Option<SystemTime>,
    ) -> Result<Vec<MultipartUpload>> {
        self.inner.incomplete_uploads(scope, abort_before).await
    }
}
