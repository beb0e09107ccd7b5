//! A [`BlobStore`] on S3 or any S3-compatible server (MinIO, LocalStack, Garage, s3s), through
//! aws-sdk-s3.
//!
//! - **Credentials** come from the standard AWS chain (`AWS_ACCESS_KEY_ID`/…, profiles,
//!   instance roles), or, for embedding and tests, from [`S3Store::connect_with_credentials`].
//!   They are never printed.
//! - **Endpoint, region, path-style** for S3-compatible servers; **SSE-S3 / SSE-KMS**.
//! - **CA bundle**: aws-sdk-rust ignores `AWS_CA_BUNDLE`; set [`S3Config::ca_bundle`] instead.
//! - **One retry layer**: the SDK's own retries are disabled ([`RetryStore`](super::retry::RetryStore)
//!   is the only retry loop), and connect, read and per-attempt timeouts are explicit, so a
//!   stalled endpoint fails with a `Transient` error instead of hanging.
//! - **Checksums**: a single PUT sends the SHA-256 (`x-amz-checksum-sha256`), so the server
//!   rejects a body that does not match. Files above [`S3Config::multipart_threshold`] go up as
//!   multipart uploads with [`S3Config::part_concurrency`] parts in flight per file and
//!   [`S3Config::max_parts_in_flight`] in all; each part is hashed (with the whole file, in
//!   order, through one 1 MiB buffer) and then streamed from the file — no part is held in
//!   memory. The checksum algorithm ([`S3Config::part_checksum`]: CRC-32C by default, or
//!   SHA-256) is named at CreateMultipartUpload, every part carries its checksum, and the
//!   upload is aborted instead of completed if the file changed since the scan: its CRC-32
//!   differs from the scan's ([`PutOptions::crc32`]), or, without one, its SHA-256.
//! - **Errors** are classified (DESIGN §9): 404 → `NotFound`; 412 → `Conflict`; 403, a missing
//!   bucket, a wrong region → `Permanent`; 5xx, 503 SlowDown, timeouts, connection failures →
//!   `Transient`; a checksum mismatch → `Corrupt`.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read as _;
use std::net::IpAddr;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use aws_sdk_s3::config::{
    BehaviorVersion, Credentials, Region, RequestChecksumCalculation, ResponseChecksumValidation,
};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{
    ChecksumAlgorithm, CompletedMultipartUpload, CompletedPart, Delete, ObjectIdentifier,
    ServerSideEncryption,
};
use aws_sdk_s3::Client;
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_types::byte_stream::Length;
use futures::stream::BoxStream;
use futures::{StreamExt as _, TryStreamExt as _};
use serde::{Deserialize, Serialize};

use super::{
    BlobKey, BlobStore, Capabilities, CreateOnly, DeleteFailures, GetResult, MultipartUpload,
    ObjectMeta, Probe, PutBody, PutMode, PutOptions, PutResult, Scope, Uploads, MAX_KEY_LEN,
};
use crate::digest::{Hasher, Sha256};
use crate::error::{Error, ErrorKind, Result};

mod body;
mod client;
mod config;
mod errors;
mod lifecycle;
mod multipart;
mod probe;
use body::*;
use client::*;
pub use config::{CreateOnlySetting, PartChecksum, S3Config, Sse, MAX_PARTS, MAX_SINGLE_PUT};
use errors::*;
pub use errors::{classify, is_throttling, kind_of_status};
pub use probe::{CreateOnlyProbe, ProbeReport, ROUNDS as PROBE_ROUNDS, WRITERS as PROBE_WRITERS};

/// The S3 store.
#[derive(Clone)]
pub struct S3Store {
    client: Client,
    config: Arc<S3Config>,
    /// What the probe found (`create-only = "auto"`), shared by clones.
    probed: Arc<tokio::sync::OnceCell<CreateOnly>>,
    /// Parts that may be on the wire at once ([`S3Config::max_parts_in_flight`]), shared by
    /// clones.
    part_budget: Arc<tokio::sync::Semaphore>,
}

impl fmt::Debug for S3Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Hand-written: the client's config holds credentials.
        f.debug_struct("S3Store")
            .field("bucket", &self.config.bucket)
            .field("prefix", &self.config.prefix)
            .field("endpoint", &self.config.endpoint)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for S3Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s3://{}/{}", self.config.bucket, self.config.prefix)?;
        if let Some(ep) = &self.config.endpoint {
            write!(f, " at {ep}")?;
        }
        Ok(())
    }
}

impl S3Store {
    /// Build a client from the settings and the AWS default credential chain. Makes no
    /// request (use the admin's validation to check reachability and permissions).
    pub async fn connect(config: S3Config) -> Result<Self> {
        Self::build(config, None).await
    }

    /// Like [`connect`](Self::connect) with explicit credentials instead of the default chain.
    pub async fn connect_with_credentials(
        config: S3Config,
        access_key_id: &str,
        secret_access_key: &str,
        session_token: Option<&str>,
    ) -> Result<Self> {
        let creds = Credentials::new(
            access_key_id,
            secret_access_key,
            session_token.map(str::to_string),
            None,
            "blobsnap",
        );
        Self::build(config, Some(creds)).await
    }

    async fn build(config: S3Config, creds: Option<Credentials>) -> Result<Self> {
        config.validate()?;
        let timeouts = aws_sdk_s3::config::timeout::TimeoutConfig::builder()
            .connect_timeout(Duration::from_millis(config.connect_timeout_ms))
            .read_timeout(Duration::from_millis(config.read_timeout_ms))
            .operation_attempt_timeout(Duration::from_millis(config.attempt_timeout_ms))
            .build();
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .retry_config(aws_sdk_s3::config::retry::RetryConfig::disabled())
            .timeout_config(timeouts);
        if let Some(region) = &config.region {
            loader = loader.region(Region::new(region.clone()));
        }
        if let Some(creds) = creds {
            crate::redact::register(creds.access_key_id());
            crate::redact::register(creds.secret_access_key());
            if let Some(t) = creds.session_token() {
                crate::redact::register(t);
            }
            loader = loader.credentials_provider(creds);
        }
        if let Some(client) = http_client(&config)? {
            loader = loader.http_client(client);
        }
        let sdk = loader.load().await;
        let mut b = aws_sdk_s3::config::Builder::from(&sdk);
        if let Some(p) = sdk.credentials_provider() {
            // Every credential the chain hands out is registered for redaction before the
            // SDK logs it (it logs the access key id at debug and trace level).
            b = b.credentials_provider(RegisteringCredentials(p));
        }
        let mut b = b
            .force_path_style(config.path_style)
            // We send our own SHA-256; the SDK's default CRC32 trailers (aws-chunked
            // encoding) are not understood by every S3-compatible server.
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired);
        if sdk.region().is_none() {
            b = b.region(Region::new("us-east-1"));
        }
        if let Some(ep) = &config.endpoint {
            b = b.endpoint_url(ep);
        }
        Ok(S3Store {
            client: Client::from_conf(b.build()),
            part_budget: Arc::new(tokio::sync::Semaphore::new(
                config.max_parts_in_flight.max(1),
            )),
            config: Arc::new(config),
            probed: Arc::default(),
        })
    }

    /// The settings this store was built from.
    pub fn config(&self) -> &S3Config {
        &self.config
    }

    /// The underlying client (for the admin: bucket creation, lifecycle rules).
    pub fn client(&self) -> &Client {
        &self.client
    }

    fn object_key(&self, key: &BlobKey) -> Result<String> {
        let full = format!("{}{}", self.config.prefix, key.as_str());
        if full.len() > MAX_KEY_LEN {
            return Err(Error::invalid(format!(
                "key {full:?} is {} bytes with the prefix, over S3's {MAX_KEY_LEN}",
                full.len()
            )));
        }
        Ok(full)
    }

    fn blob_key(&self, object_key: &str) -> Option<BlobKey> {
        let rel = object_key.strip_prefix(self.config.prefix.as_str())?;
        match BlobKey::new(rel) {
            Ok(k) => Some(k),
            Err(e) => {
                tracing::warn!(key = object_key, error = %e, "skipping an object whose key blobsnap cannot represent");
                None
            }
        }
    }

    fn what(&self, op: &str, key: &str) -> String {
        format!("{op} s3://{}/{key}", self.config.bucket)
    }

    async fn put_single(&self, key: &str, body: PutBody, opts: PutOptions) -> Result<PutResult> {
        let (stream, len, sha) = match body {
            PutBody::Bytes(bytes) => {
                let sha = opts.sha256.unwrap_or_else(|| Sha256::of(&bytes));
                let len = bytes.len() as u64;
                (ByteStream::from(bytes), len, sha)
            }
            PutBody::File { path, len } => {
                let sha = match opts.sha256 {
                    Some(s) => s,
                    None => {
                        let p = path.clone();
                        let d = tokio::task::spawn_blocking(move || crate::digest::hash_file(&p))
                            .await
                            .map_err(|e| Error::task("hash", e))??;
                        d.sha256
                    }
                };
                let stream = body::file_body(&path, 0, len).await?;
                (stream, len, sha)
            }
        };
        let mut req = self
            .client
            .put_object()
            .bucket(&self.config.bucket)
            .key(key)
            .content_length(len as i64)
            .checksum_sha256(sha.to_base64())
            .body(stream);
        if opts.mode == PutMode::CreateOnly {
            req = req.if_none_match("*");
        }
        req = match &self.config.sse {
            Sse::None => req,
            Sse::S3 => req.server_side_encryption(ServerSideEncryption::Aes256),
            Sse::Kms { key_id } => req
                .server_side_encryption(ServerSideEncryption::AwsKms)
                .set_ssekms_key_id(key_id.clone()),
        };
        let out = if self.config.verifies_sha256 {
            req.customize().disable_payload_signing().send().await
        } else {
            req.send().await
        }
        .map_err(|e| classify(self.what("put", key), e))?;
        Ok(PutResult {
            size: len,
            e_tag: out.e_tag,
            requests: 1,
        })
    }
}

impl S3Store {
    /// The capabilities as known now: the settings, and the probe's finding once it ran.
    fn known_capabilities(&self) -> Capabilities {
        Capabilities {
            create_only: match (self.config.create_only, self.probed.get()) {
                (CreateOnlySetting::Auto, Some(found)) => *found,
                (setting, _) => setting.into(),
            },
            verifies_sha256: self.config.verifies_sha256,
            multipart_listing: self.config.multipart_listing,
            tagging: self.config.tagging,
            lifecycle: self.config.lifecycle,
        }
    }
}

#[async_trait]
impl BlobStore for S3Store {
    async fn capabilities(&self, probe: Probe) -> Result<Capabilities> {
        if probe == Probe::IfUnknown && self.config.create_only == CreateOnlySetting::Auto {
            // Once per store (and its clones), even when every task asks at once.
            self.probed
                .get_or_try_init(|| async {
                    Ok::<_, Error>(self.probe_create_only().await?.create_only)
                })
                .await?;
        }
        Ok(self.known_capabilities())
    }

    #[tracing::instrument(level = "debug", skip(self, body), fields(store = %self, len = body.len()))]
    async fn put(&self, key: &BlobKey, body: PutBody, opts: PutOptions) -> Result<PutResult> {
        let object_key = self.object_key(key)?;
        match body {
            PutBody::File { path, len } if len >= self.config.multipart_threshold => {
                self.put_multipart(&object_key, path, len, opts).await
            }
            body => self.put_single(&object_key, body, opts).await,
        }
    }

    #[tracing::instrument(level = "debug", skip(self), fields(store = %self))]
    async fn get(&self, key: &BlobKey, range: Option<Range<u64>>) -> Result<GetResult> {
        let object_key = self.object_key(key)?;
        if let Some(r) = &range {
            if r.start >= r.end {
                return Err(Error::invalid(format!("empty range {r:?} for {key}")));
            }
        }
        let mut req = self
            .client
            .get_object()
            .bucket(&self.config.bucket)
            .key(&object_key);
        if let Some(r) = &range {
            req = req.range(format!("bytes={}-{}", r.start, r.end - 1));
        }
        let out = req
            .send()
            .await
            .map_err(|e| classify(self.what("get", &object_key), e))?;
        let body_len = out.content_length.and_then(|n| u64::try_from(n).ok());
        // What the body carries, and the object's size. A server or proxy may send no
        // Content-Length (a chunked body: the size comes from a HEAD, the body is read to its
        // end and checked by the caller), or ignore `Range` and send the whole object (no
        // Content-Range: the body is cut to the range asked for here).
        let (total, served, want) =
            match served_range(key, range.as_ref(), out.content_range.as_deref(), body_len)? {
                Some(found) => found,
                None => {
                    let total = self.head(key).await?.size;
                    served_range(key, range.as_ref(), None, Some(total))?
                        .ok_or_else(|| Error::transient(format!("get {key}: no size")))?
                }
            };
        if served != want {
            tracing::debug!(%key, ?want, "the server ignored Range and sent the whole object: cutting it to the range");
        }
        let meta = ObjectMeta {
            key: key.clone(),
            size: total,
            last_modified: to_system_time(out.last_modified.as_ref()),
            e_tag: out.e_tag,
        };
        let body = body_stream(
            key.clone(),
            out.body,
            want.start - served.start,
            want.end - want.start,
            Pace::new(
                Duration::from_millis(self.config.read_timeout_ms),
                self.config.min_body_bytes_per_sec,
            ),
        );
        Ok(GetResult {
            meta,
            range: want,
            body,
        })
    }

    #[tracing::instrument(level = "debug", skip(self), fields(store = %self))]
    async fn head(&self, key: &BlobKey) -> Result<ObjectMeta> {
        let object_key = self.object_key(key)?;
        let out = self
            .client
            .head_object()
            .bucket(&self.config.bucket)
            .key(&object_key)
            .send()
            .await
            .map_err(|e| classify(self.what("head", &object_key), e))?;
        Ok(ObjectMeta {
            key: key.clone(),
            size: out.content_length.unwrap_or(0).max(0) as u64,
            last_modified: to_system_time(out.last_modified.as_ref()),
            e_tag: out.e_tag,
        })
    }

    #[tracing::instrument(level = "debug", skip(self, keys), fields(store = %self, n = keys.len()))]
    async fn delete_many(&self, keys: &[BlobKey]) -> Result<DeleteFailures> {
        let mut failures = Vec::new();
        for chunk in keys.chunks(1000) {
            let mut by_object_key = std::collections::HashMap::new();
            let mut ids = Vec::with_capacity(chunk.len());
            for key in chunk {
                let ok = self.object_key(key)?;
                ids.push(
                    ObjectIdentifier::builder()
                        .key(&ok)
                        .build()
                        .map_err(|e| Error::invalid(format!("delete {key}: {e}")))?,
                );
                by_object_key.insert(ok, key.clone());
            }
            let delete = Delete::builder()
                .set_objects(Some(ids))
                .quiet(true)
                .build()
                .map_err(|e| Error::invalid(format!("delete request: {e}")))?;
            let out = self
                .client
                .delete_objects()
                .bucket(&self.config.bucket)
                .delete(delete)
                .send()
                .await
                .map_err(|e| classify(self.what("delete objects in", &self.config.prefix), e))?;
            for err in out.errors.unwrap_or_default() {
                let code = err.code.as_deref();
                if code == Some("NoSuchKey") {
                    continue; // idempotent
                }
                let object_key = err.key.clone().unwrap_or_default();
                let Some(key) = by_object_key.get(&object_key).cloned() else {
                    return Err(Error::transient(format!(
                        "delete: the server reported an error for a key not asked for: {object_key:?}"
                    )));
                };
                let kind = kind_of_status(0, code);
                let kind = if kind == ErrorKind::Permanent && code.is_none() {
                    ErrorKind::Transient
                } else {
                    kind
                };
                failures.push((
                    key,
                    Error::new(
                        kind,
                        format!(
                            "delete s3://{}/{object_key}: {} ({})",
                            self.config.bucket,
                            code.unwrap_or("unknown error"),
                            err.message.as_deref().unwrap_or("")
                        ),
                    ),
                ));
            }
        }
        Ok(failures)
    }

    fn list<'a>(&'a self, scope: &Scope) -> BoxStream<'a, Result<ObjectMeta>> {
        let prefix = format!("{}{}", self.config.prefix, scope.as_str());
        // State: (continuation token, finished?)
        futures::stream::try_unfold((None::<String>, false), move |(token, done)| {
            let prefix = prefix.clone();
            async move {
                if done {
                    return Ok(None);
                }
                let out = self
                    .client
                    .list_objects_v2()
                    .bucket(&self.config.bucket)
                    .prefix(&prefix)
                    .max_keys(self.config.list_page_size)
                    .set_continuation_token(token)
                    .send()
                    .await
                    .map_err(|e| classify(self.what("list", &prefix), e))?;
                let next = out.next_continuation_token.clone();
                let truncated = out.is_truncated.unwrap_or(false);
                if truncated && next.is_none() {
                    return Err(Error::transient(format!(
                        "list {prefix}: truncated page without a continuation token"
                    )));
                }
                let page: Vec<Result<ObjectMeta>> = out
                    .contents
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|o| {
                        let key = self.blob_key(o.key.as_deref()?)?;
                        Some(Ok(ObjectMeta {
                            key,
                            size: o.size.unwrap_or(0).max(0) as u64,
                            last_modified: to_system_time(o.last_modified.as_ref()),
                            e_tag: o.e_tag,
                        }))
                    })
                    .collect();
                Ok(Some((futures::stream::iter(page), (next, !truncated))))
            }
        })
        .try_flatten()
        .boxed()
    }

    async fn incomplete_uploads(&self, scope: &Scope, before: Option<SystemTime>) -> Uploads {
        super::incomplete_uploads(self, scope, before).await
    }
}

/// Incomplete multipart uploads: ListMultipartUploads and AbortMultipartUpload.
#[async_trait]
impl super::ListUploads for S3Store {
    async fn list_uploads(&self, scope: &Scope) -> Uploads {
        if !self.config.multipart_listing {
            return Err(Error::permanent(format!(
                "{self}: ListMultipartUploads is not supported by this server (multipart-listing = false)"
            )));
        }
        let prefix = format!("{}{}", self.config.prefix, scope.as_str());
        let mut out = Vec::new();
        let (mut key_marker, mut id_marker) = (None::<String>, None::<String>);
        loop {
            let page = self
                .client
                .list_multipart_uploads()
                .bucket(&self.config.bucket)
                .prefix(&prefix)
                .set_key_marker(key_marker.clone())
                .set_upload_id_marker(id_marker.clone())
                .send()
                .await
                .map_err(|e| classify(self.what("list multipart uploads", &prefix), e))?;
            for u in page.uploads.unwrap_or_default() {
                let (Some(k), Some(id)) = (u.key.as_deref(), u.upload_id.clone()) else {
                    continue;
                };
                if let Some(key) = self.blob_key(k) {
                    out.push(MultipartUpload {
                        key,
                        upload_id: id,
                        initiated: to_system_time(u.initiated.as_ref()),
                    });
                }
            }
            if !page.is_truncated.unwrap_or(false) {
                break;
            }
            if page.next_key_marker.is_none() && page.next_upload_id_marker.is_none() {
                return Err(Error::transient(format!(
                    "list multipart uploads {prefix}: truncated page without markers"
                )));
            }
            key_marker = page.next_key_marker;
            id_marker = page.next_upload_id_marker;
        }
        Ok(out)
    }

    async fn abort_upload(&self, upload: &MultipartUpload) -> Result<()> {
        let object_key = self.object_key(&upload.key)?;
        match self
            .client
            .abort_multipart_upload()
            .bucket(&self.config.bucket)
            .key(&object_key)
            .upload_id(&upload.upload_id)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => {
                let e = classify(self.what("abort multipart upload", &object_key), e);
                if e.kind() == ErrorKind::NotFound {
                    Ok(())
                } else {
                    Err(e)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::multipart::*;
    use super::*;

    #[test]
    fn fixed_addresses_exact_before_the_nearest_wildcard() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let r = FixedAddresses::new(
            &[
                ("s3.internal".to_owned(), ip("10.0.0.1")),
                ("*.s3.internal".to_owned(), ip("10.0.0.2")),
                ("*.eu.s3.internal".to_owned(), ip("10.0.0.3")),
                ("state.eu.s3.internal".to_owned(), ip("10.0.0.4")),
            ]
            .into(),
        );
        let at = |n: &str| r.lookup(n).map(|i| i.to_string());
        assert_eq!(at("s3.internal").as_deref(), Some("10.0.0.1"));
        assert_eq!(at("S3.Internal.").as_deref(), Some("10.0.0.1"));
        assert_eq!(at("bucket.s3.internal").as_deref(), Some("10.0.0.2"));
        assert_eq!(at("a.b.s3.internal").as_deref(), Some("10.0.0.2"));
        assert_eq!(at("bucket.eu.s3.internal").as_deref(), Some("10.0.0.3"));
        assert_eq!(at("state.eu.s3.internal").as_deref(), Some("10.0.0.4"));
        assert_eq!(at("internal"), None);
        assert_eq!(at("other.example"), None);
        assert_eq!(at("xs3.internal"), None);
    }

    #[test]
    fn s3_size_limits() {
        // The configured part size while it fits S3's 10,000 parts; larger whole MiB after.
        assert_eq!(part_size_for(16 << 20, 8 << 30), 16 << 20);
        assert_eq!(part_size_for(16 << 20, 10_000 * (16 << 20)), 16 << 20);
        let big = 200u64 << 30;
        let p = part_size_for(16 << 20, big);
        assert!(p > 16 << 20 && p.is_multiple_of(1 << 20));
        assert!(big.div_ceil(p) <= MAX_PARTS && big.div_ceil(p - (1 << 20)) > MAX_PARTS);
        // A single PUT over 5 GiB is refused by S3: so is such a threshold.
        let config = |threshold: u64| S3Config {
            bucket: "b-ok".into(),
            multipart_threshold: threshold,
            ..Default::default()
        };
        assert!(config(MAX_SINGLE_PUT).validate().is_ok());
        let e = config(MAX_SINGLE_PUT + 1).validate().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains("5 GiB"), "{e}");
    }

    #[test]
    fn classification_table() {
        assert_eq!(kind_of_status(503, Some("SlowDown")), ErrorKind::Transient);
        assert!(errors::is_throttling(503, Some("SlowDown")));
        assert!(errors::is_throttling(429, None) && errors::is_throttling(503, None));
        assert!(!errors::is_throttling(503, Some("ServiceUnavailable")));
        assert!(!errors::is_throttling(500, Some("InternalError")));
        assert!(pem_certificates(b"not a certificate").is_err());
        assert!(
            pem_certificates(b"-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n")
                .is_err()
        );
        assert!(pem_certificates(b"-----BEGIN CERTIFICATE-----\nAAAA\n").is_err());
        // Valid base64, not a certificate: refused here (the TLS layer would panic on it).
        assert!(pem_certificates(
            b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
        )
        .is_err());
        assert_eq!(
            kind_of_status(403, Some("AccessDenied")),
            ErrorKind::Permanent
        );
        assert_eq!(kind_of_status(403, None), ErrorKind::Permanent);
        assert_eq!(kind_of_status(404, Some("NoSuchKey")), ErrorKind::NotFound);
        assert_eq!(kind_of_status(404, None), ErrorKind::NotFound);
        assert_eq!(
            kind_of_status(404, Some("NoSuchBucket")),
            ErrorKind::Permanent
        );
        assert_eq!(kind_of_status(412, None), ErrorKind::Conflict);
        assert_eq!(kind_of_status(400, Some("BadDigest")), ErrorKind::Corrupt);
        assert_eq!(
            kind_of_status(400, Some("RequestTimeout")),
            ErrorKind::Transient
        );
        assert_eq!(kind_of_status(500, None), ErrorKind::Transient);
        assert_eq!(kind_of_status(301, None), ErrorKind::Permanent);
        assert_eq!(
            kind_of_status(501, Some("NotImplemented")),
            ErrorKind::Permanent
        );
        assert_eq!(kind_of_status(501, None), ErrorKind::Permanent);
    }

    #[test]
    fn config_validation() {
        let ok = S3Config {
            bucket: "my-bucket".into(),
            ..Default::default()
        };
        assert!(ok.validate().is_ok());
        for bad in [
            S3Config {
                bucket: "B".into(),
                ..ok.clone()
            },
            S3Config {
                prefix: "no-slash".into(),
                ..ok.clone()
            },
            S3Config {
                part_size: 1 << 20,
                ..ok.clone()
            },
            S3Config {
                part_concurrency: 0,
                ..ok.clone()
            },
        ] {
            assert_eq!(bad.validate().unwrap_err().kind(), ErrorKind::InvalidInput);
        }
    }

    #[test]
    fn what_a_response_carries() {
        let key = BlobKey::new("k").unwrap();
        let r = |a: u64, b: u64| a..b;
        // A proper 206.
        assert_eq!(
            served_range(&key, Some(&r(10, 20)), Some("bytes 10-19/100"), Some(10)).unwrap(),
            Some((100, r(10, 20), r(10, 20)))
        );
        // Range ignored: a 200 with the whole object, cut by the caller.
        assert_eq!(
            served_range(&key, Some(&r(10, 20)), None, Some(100)).unwrap(),
            Some((100, r(0, 100), r(10, 20)))
        );
        // No Content-Length (chunked): a HEAD must tell the size.
        assert_eq!(served_range(&key, None, None, None).unwrap(), None);
        assert_eq!(
            served_range(&key, Some(&r(0, 5)), None, None).unwrap(),
            None
        );
        // The wrong part: retry. Outside the object: invalid.
        let e =
            served_range(&key, Some(&r(10, 20)), Some("bytes 20-29/100"), Some(10)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Transient);
        let e = served_range(&key, Some(&r(90, 120)), None, Some(100)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
    }

    /// The body of a server that ignored `Range` is cut to the range (a trickling body is
    /// tested through the proxy in `tests/it/faults.rs`).
    #[tokio::test]
    async fn bodies_are_cut_to_the_range() {
        use futures::TryStreamExt as _;
        let key = BlobKey::new("k").unwrap();
        let whole: Vec<u8> = (0..100u8).collect();
        let body = body_stream(
            key.clone(),
            ByteStream::from(whole.clone()),
            10,
            10,
            Pace::new(Duration::from_secs(30), 1024),
        );
        let got: Vec<bytes::Bytes> = body.try_collect().await.unwrap();
        assert_eq!(got.concat(), &whole[10..20]);
    }

    #[test]
    fn content_range_parsed_strictly() {
        assert_eq!(parse_content_range("bytes 0-9/100"), Some((0..10, 100)));
        assert_eq!(parse_content_range("bytes 90-99/100"), Some((90..100, 100)));
        for bad in [
            "bytes 0-9/*",
            "bytes 9-0/100",
            "bytes 0-100/100",
            "0-9/100",
            "bytes */100",
        ] {
            assert_eq!(parse_content_range(bad), None, "{bad}");
        }
    }
}
