//! What an S3-compatible server really does, found by asking it (`blobsnap probe`, and
//! `create-only = "auto"`).
//!
//! **Create-only writes** are the fence of DESIGN §7: of two processes writing checkpoint
//! number N, exactly one may succeed. A server can accept `If-None-Match: *` and still not
//! give that: Garage 2.x ignores it (a second put overwrites), s3s-fs checks and then writes
//! (a second *sequential* put fails, concurrent ones may both succeed). So the probe sends
//! [`WRITERS`] create-only puts of different bodies to one fresh scratch key *at once*, in
//! [`ROUNDS`] rounds: more than one winner in any round, or a stored body that is not the
//! winner's, means no fence; then one sequential second put tells `Racy` from `Ignored`.
//! A probe can prove the absence of a fence, never its presence: a server that serialises
//! requests by chance could pass it while still being racy, so an endpoint known to be
//! atomic (AWS S3) can be configured as such and skip the probe.
//!
//! The scratch objects live under `<prefix>.blobsnap-probe/<random>/` and are deleted
//! afterwards; nothing else in the bucket is touched.

use aws_sdk_s3::error::ProvideErrorMetadata;
use aws_sdk_s3::primitives::ByteStream;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt as _;
use serde::Serialize;

use super::{classify, CreateOnly, S3Store};
use crate::digest::Sha256;
use crate::error::{Error, ErrorKind, Result};

/// Concurrent create-only writers per round.
pub const WRITERS: usize = 16;
/// Rounds of the concurrent test.
pub const ROUNDS: usize = 4;
/// Body size of each writer: big enough that a check-then-write server has a window.
const BODY_LEN: usize = 128 << 10;

/// How the create-only test went.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct CreateOnlyProbe {
    /// `atomic`, `racy` or `ignored`.
    pub verdict: String,
    /// Winners of each concurrent round (an atomic server: 1 each).
    pub winners_per_round: Vec<usize>,
    /// Whether a sequential second create-only put was refused.
    pub sequential_refused: Option<bool>,
    /// The finding as a [`CreateOnly`].
    #[serde(skip)]
    pub create_only: CreateOnly,
}

/// Everything `blobsnap probe` finds out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct ProbeReport {
    /// The create-only test.
    pub create_only: CreateOnlyProbe,
    /// A put whose `x-amz-checksum-sha256` does not match its body was refused *and* not
    /// stored.
    pub verifies_sha256: bool,
    /// The same with `x-amz-checksum-crc32c` (the default checksum of multipart parts).
    pub verifies_crc32c: bool,
    /// ListMultipartUploads answers.
    pub multipart_listing: bool,
    /// PutObjectTagging answers.
    pub tagging: bool,
    /// GetBucketLifecycleConfiguration answers (or says there is none).
    pub lifecycle: bool,
}

impl ProbeReport {
    /// The `[s3]` settings lines that describe this server.
    pub fn settings_toml(&self) -> String {
        format!(
            "create-only = \"{}\"\nverifies-sha256 = {}\npart-checksum = \"{}\"\nmultipart-listing = {}\ntagging = {}\nlifecycle = {}\n",
            self.create_only.verdict,
            self.verifies_sha256,
            if self.verifies_crc32c || !self.verifies_sha256 {
                "crc32c"
            } else {
                "sha256"
            },
            self.multipart_listing,
            self.tagging,
            self.lifecycle
        )
    }
}

fn not_implemented(code: Option<&str>, status: Option<u16>) -> bool {
    code == Some("NotImplemented") || status == Some(501)
}

/// Whether an optional feature answered: `Ok(true)` it works, `Ok(false)` 501 /
/// NotImplemented, `Err` any other failure (classified, naming `what`).
fn supported<T, E>(
    r: std::result::Result<
        T,
        aws_sdk_s3::error::SdkError<E, aws_smithy_runtime_api::client::orchestrator::HttpResponse>,
    >,
    what: String,
) -> Result<bool>
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match r {
        Ok(_) => Ok(true),
        Err(e) => {
            let status = e.raw_response().map(|r| r.status().as_u16());
            if not_implemented(e.code(), status) {
                Ok(false)
            } else {
                Err(classify(what, e))
            }
        }
    }
}

/// How long a writer of a race waits at the [`Gate`] for the others (a server that takes
/// fewer connections at once than there are writers must not stall the probe).
const GATE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Where the writers of one race meet: each has sent the first half of its body and waits
/// until all have (or [`GATE_WAIT`] passed) before it sends the rest. Then every put of the
/// round is in flight on the server at once, however loaded this machine is (without it, a
/// busy machine sent the 16 puts one after another and a server that checks `If-None-Match`
/// before it writes, such as s3s-fs, looked atomic).
struct Gate {
    writers: usize,
    arrived: std::sync::atomic::AtomicUsize,
    all: tokio::sync::Notify,
}

impl Gate {
    fn new(writers: usize) -> Self {
        Gate {
            writers,
            arrived: std::sync::atomic::AtomicUsize::new(0),
            all: tokio::sync::Notify::new(),
        }
    }

    async fn arrive_and_wait(&self) {
        let all = self.all.notified();
        tokio::pin!(all);
        all.as_mut().enable();
        let n = self
            .arrived
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1;
        if n >= self.writers {
            self.all.notify_waiters();
            return;
        }
        if tokio::time::timeout(GATE_WAIT, all).await.is_err() {
            tracing::debug!(
                arrived = n,
                writers = self.writers,
                "probe gate opened by its timeout"
            );
        }
    }
}

/// `body` as a stream of two halves with `gate` between them.
fn gated_body(body: Bytes, gate: Arc<Gate>) -> ByteStream {
    use http_body::Frame;
    let half = body.len() / 2;
    let (first, second) = (body.slice(..half), body.slice(half..));
    let frames = futures::stream::iter([Ok::<_, std::convert::Infallible>(Frame::data(first))])
        .chain(futures::stream::once(async move {
            gate.arrive_and_wait().await;
            Ok(Frame::data(second))
        }));
    ByteStream::from_body_1_x(http_body_util::StreamBody::new(frames))
}

impl S3Store {
    fn scratch_prefix(&self) -> String {
        format!(
            "{}.blobsnap-probe/{:016x}/",
            self.config.prefix,
            rand::random::<u64>()
        )
    }

    /// One create-only put: `Ok(Some(true))` stored, `Ok(Some(false))` refused (412, or 409
    /// for a conditional write that lost a race), `Ok(None)` unknown (a transient failure: it
    /// may or may not have been stored), `Err` anything else.
    async fn probe_put_once(&self, key: &str, body: Bytes) -> Result<Option<bool>> {
        self.probe_put_once_with(key, &body, None).await
    }

    async fn probe_put_once_with(
        &self,
        key: &str,
        body: &Bytes,
        gate: Option<Arc<Gate>>,
    ) -> Result<Option<bool>> {
        let sha = Sha256::of(body);
        let req = self
            .client
            .put_object()
            .bucket(&self.config.bucket)
            .key(key)
            .content_length(body.len() as i64)
            .checksum_sha256(sha.to_base64())
            .if_none_match("*");
        let r = match gate {
            None => req.body(ByteStream::from(body.clone())).send().await,
            // A streamed body cannot be signed before it is sent; the SHA-256 header still
            // lets the server check it.
            Some(gate) => {
                req.body(gated_body(body.clone(), gate))
                    .customize()
                    .disable_payload_signing()
                    .send()
                    .await
            }
        };
        match r {
            Ok(_) => Ok(Some(true)),
            Err(e) => {
                let status = e.raw_response().map(|r| r.status().as_u16());
                if matches!(status, Some(412) | Some(409)) {
                    Ok(Some(false))
                } else {
                    let e = classify(self.what("probe put", key), e);
                    if e.kind() == ErrorKind::Transient {
                        Ok(None)
                    } else {
                        Err(e)
                    }
                }
            }
        }
    }

    /// [`Self::probe_put`] of one writer of a race: its body waits at `gate` halfway.
    async fn probe_put_gated(&self, key: &str, body: Bytes, gate: Arc<Gate>) -> Result<bool> {
        match self.probe_put_once_with(key, &body, Some(gate)).await? {
            Some(won) => Ok(won),
            // Unknown: settled by the retries of the plain put (the gate is open by then).
            None => self.probe_put(key, body).await,
        }
    }

    /// A create-only put whose outcome must be known: retried while transient. A retry that
    /// is refused after an unknown attempt is ambiguous (the first may have stored it); the
    /// caller only uses this where that cannot mislead (fresh keys, sequential puts).
    async fn probe_put(&self, key: &str, body: Bytes) -> Result<bool> {
        for attempt in 0..8u32 {
            if let Some(won) = self.probe_put_once(key, body.clone()).await? {
                return Ok(
                    won || attempt > 0 && self.probe_get_sha(key).await? == Sha256::of(&body)
                );
            }
            tokio::time::sleep(std::time::Duration::from_millis(50 << attempt.min(5))).await;
        }
        Err(Error::transient(format!(
            "{}: no definite answer after 8 attempts",
            self.what("probe put", key)
        )))
    }

    async fn probe_get_sha(&self, key: &str) -> Result<Sha256> {
        let mut last = None;
        for attempt in 0..8u32 {
            match self.probe_get_sha_once(key).await {
                Ok(s) => return Ok(s),
                Err(e) if e.kind() == ErrorKind::Transient => last = Some(e),
                Err(e) => return Err(e),
            }
            tokio::time::sleep(std::time::Duration::from_millis(50 << attempt.min(5))).await;
        }
        Err(last.unwrap_or_else(|| Error::transient("probe get")))
    }

    async fn probe_get_sha_once(&self, key: &str) -> Result<Sha256> {
        let out = self
            .client
            .get_object()
            .bucket(&self.config.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| classify(self.what("probe get", key), e))?;
        let bytes =
            out.body.collect().await.map_err(|e| {
                Error::transient(format!("{}: body: {e}", self.what("probe get", key)))
            })?;
        Ok(Sha256::of(&bytes.into_bytes()))
    }

    async fn probe_cleanup(&self, prefix: &str) {
        let mut token = None;
        loop {
            let page = match self
                .client
                .list_objects_v2()
                .bucket(&self.config.bucket)
                .prefix(prefix)
                .set_continuation_token(token.take())
                .send()
                .await
            {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(prefix, error = %classify(self.what("probe cleanup", prefix), e), "probe scratch objects left behind");
                    return;
                }
            };
            for o in page.contents.unwrap_or_default() {
                if let Some(k) = o.key {
                    if let Err(e) = self
                        .client
                        .delete_object()
                        .bucket(&self.config.bucket)
                        .key(&k)
                        .send()
                        .await
                    {
                        tracing::warn!(key = k, error = %classify(self.what("probe cleanup", &k), e), "probe scratch object left behind");
                    }
                }
            }
            match page.next_continuation_token {
                Some(t) if page.is_truncated.unwrap_or(false) => token = Some(t),
                _ => return,
            }
        }
    }

    /// The create-only test alone (what `create-only = "auto"` runs).
    pub async fn probe_create_only(&self) -> Result<CreateOnlyProbe> {
        let prefix = self.scratch_prefix();
        let r = self.probe_create_only_in(&prefix).await;
        self.probe_cleanup(&prefix).await;
        let found = r?;
        tracing::info!(store = %self, verdict = found.verdict, winners = ?found.winners_per_round, "probed create-only writes");
        Ok(found)
    }

    async fn probe_create_only_in(&self, prefix: &str) -> Result<CreateOnlyProbe> {
        let mut winners_per_round = Vec::new();
        let mut fenced = true;
        for round in 0..ROUNDS {
            let key = format!("{prefix}race-{round}");
            let bodies: Vec<Bytes> = (0..WRITERS)
                .map(|w| {
                    let mut b = vec![0u8; BODY_LEN];
                    let tag = format!("blobsnap create-only probe round {round} writer {w}\n");
                    b[..tag.len()].copy_from_slice(tag.as_bytes());
                    b[BODY_LEN - 8..].copy_from_slice(&(w as u64).to_le_bytes());
                    Bytes::from(b)
                })
                .collect();
            let gate = Arc::new(Gate::new(WRITERS));
            let results = futures::future::join_all(
                bodies
                    .iter()
                    .map(|b| self.probe_put_gated(&key, b.clone(), Arc::clone(&gate))),
            )
            .await;
            let mut won = Vec::new();
            for (w, r) in results.into_iter().enumerate() {
                if r? {
                    won.push(w);
                }
            }
            winners_per_round.push(won.len());
            match won.as_slice() {
                [w] => {
                    // The one winner's bytes must be what is stored.
                    if self.probe_get_sha(&key).await? != Sha256::of(&bodies[*w]) {
                        fenced = false;
                    }
                }
                [] => {
                    // A winner whose response was lost (and whose resend was then refused)
                    // looks like a server that refuses every create-only put: the key tells
                    // them apart. Found through the fault proxy.
                    return Err(match self.probe_get_sha(&key).await {
                        Ok(sha) if bodies.iter().any(|b| Sha256::of(b) == sha) => {
                            Error::transient(format!(
                                "{}: every create-only put was refused, but one of them had written the key (its response was lost); probe again",
                                self.what("probe", &key)
                            ))
                        }
                        Err(e) if e.kind() != ErrorKind::NotFound => e,
                        _ => Error::permanent(format!(
                            "{}: every one of {WRITERS} create-only puts of a new key was refused",
                            self.what("probe", &key)
                        )),
                    });
                }
                _ => fenced = false,
            }
            if !fenced {
                break;
            }
        }
        if fenced {
            return Ok(CreateOnlyProbe {
                verdict: "atomic".into(),
                winners_per_round,
                sequential_refused: None,
                create_only: CreateOnly::Atomic,
            });
        }
        let key = format!("{prefix}sequential");
        self.probe_put(&key, Bytes::from_static(b"first")).await?;
        let refused = !self.probe_put(&key, Bytes::from_static(b"second")).await?;
        let (verdict, create_only) = if refused {
            ("racy", CreateOnly::Racy)
        } else {
            ("ignored", CreateOnly::Ignored)
        };
        Ok(CreateOnlyProbe {
            verdict: verdict.into(),
            winners_per_round,
            sequential_refused: Some(refused),
            create_only,
        })
    }

    /// Whether a put whose checksum (set by `with_checksum`) does not match its body is
    /// refused *and* leaves nothing stored.
    async fn refuses_bad_checksum(
        &self,
        key: &str,
        with_checksum: impl FnOnce(
            aws_sdk_s3::operation::put_object::builders::PutObjectFluentBuilder,
        ) -> aws_sdk_s3::operation::put_object::builders::PutObjectFluentBuilder,
    ) -> Result<bool> {
        let bucket = &self.config.bucket;
        let body = Bytes::from_static(b"the body");
        let refused = with_checksum(
            self.client
                .put_object()
                .bucket(bucket)
                .key(key)
                .content_length(body.len() as i64),
        )
        .body(ByteStream::from(body))
        .send()
        .await
        .is_err();
        let stored = match self
            .client
            .head_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
        {
            Ok(_) => true,
            Err(e) if e.raw_response().map(|r| r.status().as_u16()) == Some(404) => false,
            Err(e) => return Err(classify(self.what("probe head", key), e)),
        };
        Ok(refused && !stored)
    }

    /// Probe everything blobsnap depends on: create-only writes, SHA-256 verification,
    /// multipart listing, tagging, lifecycle. Needs write access to the bucket.
    pub async fn probe(&self) -> Result<ProbeReport> {
        let prefix = self.scratch_prefix();
        let r = self.probe_all_in(&prefix).await;
        self.probe_cleanup(&prefix).await;
        r
    }

    async fn probe_all_in(&self, prefix: &str) -> Result<ProbeReport> {
        let create_only = self.probe_create_only_in(prefix).await?;
        let bucket = &self.config.bucket;

        // A body with someone else's checksum: refused, and nothing stored.
        let verifies_sha256 = self
            .refuses_bad_checksum(&format!("{prefix}bad-sha256"), |r| {
                r.checksum_sha256(Sha256::of(b"another body").to_base64())
            })
            .await?;
        let verifies_crc32c = self
            .refuses_bad_checksum(&format!("{prefix}bad-crc32c"), |r| {
                use base64::Engine as _;
                r.checksum_crc32_c(
                    base64::engine::general_purpose::STANDARD
                        .encode(crc32c::crc32c(b"another body").to_be_bytes()),
                )
            })
            .await?;

        let multipart_listing = supported(
            self.client
                .list_multipart_uploads()
                .bucket(bucket)
                .prefix(prefix)
                .send()
                .await,
            self.what("probe list multipart uploads", prefix),
        )?;

        let key = format!("{prefix}tagging");
        self.probe_put(&key, Bytes::from_static(b"tag me")).await?;
        let tagging = supported(
            self.client
                .put_object_tagging()
                .bucket(bucket)
                .key(&key)
                .tagging(
                    aws_sdk_s3::types::Tagging::builder()
                        .tag_set(
                            aws_sdk_s3::types::Tag::builder()
                                .key("blobsnap-probe")
                                .value("1")
                                .build()
                                .map_err(|e| Error::invalid(format!("probe tag: {e}")))?,
                        )
                        .build()
                        .map_err(|e| Error::invalid(format!("probe tagging: {e}")))?,
                )
                .send()
                .await,
            self.what("probe put tagging", &key),
        )?;

        let lifecycle = match self
            .client
            .get_bucket_lifecycle_configuration()
            .bucket(bucket)
            .send()
            .await
        {
            Ok(_) => true,
            Err(e) => {
                let status = e.raw_response().map(|r| r.status().as_u16());
                if e.code() == Some("NoSuchLifecycleConfiguration")
                    || (status == Some(404) && e.code() != Some("NoSuchBucket"))
                {
                    true
                } else if not_implemented(e.code(), status) {
                    false
                } else {
                    return Err(classify(self.what("probe lifecycle", bucket), e));
                }
            }
        };

        Ok(ProbeReport {
            create_only,
            verifies_sha256,
            verifies_crc32c,
            multipart_listing,
            tagging,
            lifecycle,
        })
    }
}
