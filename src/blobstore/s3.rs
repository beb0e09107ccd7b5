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
    ObjectMeta, PutBody, PutMode, PutOptions, PutResult, Scope, MAX_KEY_LEN,
};
use crate::digest::{Hasher, Sha256};
use crate::error::{Error, ErrorKind, Result};

mod probe;
pub use probe::{CreateOnlyProbe, ProbeReport, ROUNDS as PROBE_ROUNDS, WRITERS as PROBE_WRITERS};

/// Server-side encryption of stored objects.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "type")]
pub enum Sse {
    /// None requested (the bucket's default applies).
    #[default]
    None,
    /// SSE-S3 (AES256).
    S3,
    /// SSE-KMS, with the bucket's default key or the one named.
    Kms {
        /// The KMS key id or ARN.
        key_id: Option<String>,
    },
}

/// The checksum each multipart part carries (`x-amz-checksum-*`), which the server checks
/// against the bytes it received. The whole file's SHA-256 (its content address) is
/// computed at the scan either way, and checked again while the parts are read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PartChecksum {
    /// CRC-32C (the default): hardware-accelerated on both ends, so neither the client nor
    /// the server spends a SHA-256 pass per part on the wire check.
    #[default]
    Crc32c,
    /// SHA-256 of every part: a second full hash on the client and on the server.
    Sha256,
}

/// How a store treats create-only puts, as configured per endpoint (see [`CreateOnly`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CreateOnlySetting {
    /// Probe the server (the default): many concurrent create-only puts to one scratch key
    /// tell [`Atomic`](Self::Atomic) from [`Racy`](Self::Racy) and [`Ignored`](Self::Ignored)
    /// the first time fencing matters ([`BlobStore::probe_capabilities`]). Until then the
    /// store counts as not fencing.
    #[default]
    Auto,
    /// AWS S3, LocalStack, MinIO: exclusive under concurrency.
    Atomic,
    /// Checked but racy (s3s-fs).
    Racy,
    /// Not enforced (Garage 2.x).
    Ignored,
}

impl From<CreateOnlySetting> for CreateOnly {
    fn from(s: CreateOnlySetting) -> Self {
        match s {
            CreateOnlySetting::Auto => CreateOnly::Unknown,
            CreateOnlySetting::Atomic => CreateOnly::Atomic,
            CreateOnlySetting::Racy => CreateOnly::Racy,
            CreateOnlySetting::Ignored => CreateOnly::Ignored,
        }
    }
}

/// S3's largest single PUT, and largest part (5 GiB).
pub const MAX_SINGLE_PUT: u64 = 5 << 30;
/// S3's most parts in one multipart upload.
pub const MAX_PARTS: u64 = 10_000;

/// Settings of the S3 store: plain data, loadable from TOML (`[s3]`) and `BLOBSNAP_S3_*` env.
/// Credentials are deliberately not here: they come from the AWS default chain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct S3Config {
    /// The bucket.
    pub bucket: String,
    /// A key prefix inside the bucket (`""` or ending in `/`), applied to every key.
    pub prefix: String,
    /// The region (`AWS_REGION` or the profile's when unset; `us-east-1` as a last resort).
    pub region: Option<String>,
    /// A custom endpoint URL (MinIO, LocalStack, Garage: `http://127.0.0.1:PORT`).
    pub endpoint: Option<String>,
    /// Path-style addressing (`endpoint/bucket/key`), which most S3-compatible servers need.
    pub path_style: bool,
    /// A PEM file of CA certificates to trust, in addition to the system roots.
    pub ca_bundle: Option<PathBuf>,
    /// Host names to connect to at a fixed address instead of asking DNS, like curl's
    /// `--resolve`: `"s3.internal" = "10.0.0.5"`; a key `"*.s3.internal"` covers every name
    /// under it (the `<bucket>.<host>` names of virtual-hosted addressing). An exact name wins
    /// over a wildcard; a name not listed is resolved by the system as usual. TLS still
    /// checks the certificate against the name, not the address.
    pub resolve: BTreeMap<String, IpAddr>,
    /// Server-side encryption.
    pub sse: Sse,
    /// TCP connect timeout, ms.
    #[serde(deserialize_with = "crate::units::millis")]
    pub connect_timeout_ms: u64,
    /// Timeout of one socket read, ms: a stalled server fails instead of hanging.
    #[serde(deserialize_with = "crate::units::millis")]
    pub read_timeout_ms: u64,
    /// The slowest body a GET accepts, bytes/s, averaged over each `read-timeout-ms` window:
    /// a server that trickles a few bytes at a time (each socket read within the read
    /// timeout) fails `Transient` instead of stalling a restore (0: no limit).
    #[serde(deserialize_with = "crate::units::bytes")]
    pub min_body_bytes_per_sec: u64,
    /// Timeout of one request attempt, ms (a single PUT of a file up to the multipart threshold
    /// must fit).
    #[serde(deserialize_with = "crate::units::millis")]
    pub attempt_timeout_ms: u64,
    /// Files of at least this many bytes are uploaded as multipart uploads.
    #[serde(deserialize_with = "crate::units::bytes")]
    pub multipart_threshold: u64,
    /// Size of one multipart part (at least 5 MiB, S3's minimum).
    #[serde(deserialize_with = "crate::units::bytes")]
    pub part_size: u64,
    /// Parts in flight at once per multipart upload.
    pub part_concurrency: usize,
    /// Multipart parts on the wire at once across every upload of this store (parts stream
    /// from disk: this bounds connections and open files, whatever the number of files in
    /// flight).
    pub max_parts_in_flight: usize,
    /// Keys per ListObjectsV2 page (1..=1000).
    pub list_page_size: i32,
    /// Whether the server enforces `If-None-Match: *` on PUT, and how.
    pub create_only: CreateOnlySetting,
    /// Whether the server verifies `x-amz-checksum-sha256` (and the part checksums): then
    /// payloads are sent unsigned, since signing would hash every byte once more.
    pub verifies_sha256: bool,
    /// The checksum of each multipart part.
    pub part_checksum: PartChecksum,
    /// Whether ListMultipartUploads works.
    pub multipart_listing: bool,
    /// Whether object tagging works.
    pub tagging: bool,
    /// Whether bucket lifecycle configuration works.
    pub lifecycle: bool,
}

impl Default for S3Config {
    fn default() -> Self {
        S3Config {
            bucket: String::new(),
            prefix: String::new(),
            region: None,
            endpoint: None,
            path_style: false,
            ca_bundle: None,
            resolve: BTreeMap::new(),
            sse: Sse::None,
            connect_timeout_ms: 3_000,
            read_timeout_ms: 30_000,
            min_body_bytes_per_sec: 1024,
            attempt_timeout_ms: 300_000,
            multipart_threshold: 64 << 20,
            part_size: 16 << 20,
            part_concurrency: 8,
            max_parts_in_flight: 16,
            list_page_size: 1000,
            create_only: CreateOnlySetting::Auto,
            verifies_sha256: true,
            part_checksum: PartChecksum::Crc32c,
            multipart_listing: true,
            tagging: true,
            lifecycle: true,
        }
    }
}

impl S3Config {
    /// Check the settings without contacting the server.
    pub fn validate(&self) -> Result<()> {
        let bucket_ok = (3..=63).contains(&self.bucket.len())
            && self
                .bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        if !bucket_ok {
            return Err(Error::invalid(format!(
                "s3 bucket {:?} is not a valid bucket name (3-63 of a-z 0-9 . -)",
                self.bucket
            )));
        }
        for name in self.resolve.keys() {
            let bare = name.strip_prefix("*.").unwrap_or(name);
            let ok = !bare.is_empty()
                && bare.split('.').all(|label| {
                    !label.is_empty()
                        && label.len() <= 63
                        && label
                            .bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                });
            if !ok {
                return Err(Error::invalid(format!(
                    "s3 resolve: {name:?} is not a lowercase host name (or \"*.\" and one)"
                )));
            }
        }
        if !self.prefix.is_empty() {
            Scope::new(self.prefix.clone())
                .map_err(|e| e.context("s3 prefix must be empty or end in '/'"))?;
        }
        if self.part_size < 5 << 20 {
            return Err(Error::invalid(format!(
                "s3 part-size {} is below S3's 5 MiB minimum",
                self.part_size
            )));
        }
        if self.part_size > MAX_SINGLE_PUT {
            return Err(Error::invalid(format!(
                "s3 part-size {} is above S3's 5 GiB maximum",
                self.part_size
            )));
        }
        if self.multipart_threshold < self.part_size {
            return Err(Error::invalid(
                "s3 multipart-threshold must be at least part-size",
            ));
        }
        if self.multipart_threshold > MAX_SINGLE_PUT {
            return Err(Error::invalid(format!(
                "s3 multipart-threshold {} is above S3's 5 GiB limit of a single PUT: larger files must go up in parts",
                self.multipart_threshold
            )));
        }
        if self.part_concurrency == 0 {
            return Err(Error::invalid("s3 part-concurrency must be at least 1"));
        }
        if !(1..=1000).contains(&self.list_page_size) {
            return Err(Error::invalid("s3 list-page-size must be within 1..=1000"));
        }
        Ok(())
    }
}

/// A credentials provider that registers what it provides with [`crate::redact`].
struct RegisteringCredentials(aws_sdk_s3::config::SharedCredentialsProvider);

impl fmt::Debug for RegisteringCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RegisteringCredentials(..)")
    }
}

impl aws_sdk_s3::config::ProvideCredentials for RegisteringCredentials {
    fn provide_credentials<'a>(
        &'a self,
    ) -> aws_credential_types::provider::future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        aws_credential_types::provider::future::ProvideCredentials::new(async move {
            let c = self.0.provide_credentials().await?;
            crate::redact::register(c.access_key_id());
            crate::redact::register(c.secret_access_key());
            if let Some(t) = c.session_token() {
                crate::redact::register(t);
            }
            Ok(c)
        })
    }
}

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
                let stream = ByteStream::read_from()
                    .path(&path)
                    .length(Length::Exact(len))
                    .build()
                    .await
                    .map_err(|e| {
                        Error::new(ErrorKind::Io, format!("open {} for upload", path.display()))
                            .with_source(e)
                    })?;
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

    async fn put_multipart(
        &self,
        key: &str,
        path: PathBuf,
        len: u64,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let mut create = self
            .client
            .create_multipart_upload()
            .bucket(&self.config.bucket)
            .key(key)
            .checksum_algorithm(match self.config.part_checksum {
                PartChecksum::Crc32c => ChecksumAlgorithm::Crc32C,
                PartChecksum::Sha256 => ChecksumAlgorithm::Sha256,
            });
        create = match &self.config.sse {
            Sse::None => create,
            Sse::S3 => create.server_side_encryption(ServerSideEncryption::Aes256),
            Sse::Kms { key_id } => create
                .server_side_encryption(ServerSideEncryption::AwsKms)
                .set_ssekms_key_id(key_id.clone()),
        };
        let created = create
            .send()
            .await
            .map_err(|e| classify(self.what("create multipart upload", key), e))?;
        let upload_id = created.upload_id.ok_or_else(|| {
            Error::transient(format!(
                "{}: the server returned no upload id",
                self.what("create multipart upload", key)
            ))
        })?;
        let result = self
            .upload_parts_and_complete(key, &upload_id, path, len, opts)
            .await;
        if result.is_err() {
            let abort = self
                .client
                .abort_multipart_upload()
                .bucket(&self.config.bucket)
                .key(key)
                .upload_id(&upload_id)
                .send()
                .await;
            if let Err(e) = abort {
                tracing::warn!(key, upload_id, error = %classify(self.what("abort multipart upload", key), e),
                    "could not abort a failed multipart upload; the sweep will");
            }
        }
        result
    }

    async fn upload_parts_and_complete(
        &self,
        key: &str,
        upload_id: &str,
        path: PathBuf,
        len: u64,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let part_size = part_size_for(self.config.part_size, len);
        let n_parts = len.div_ceil(part_size).max(1);
        // The guard that the file did not change since the scan: its CRC-32 when the scan's
        // is known (cheap; the server checks every part), else its SHA-256 again.
        let whole = match (opts.sha256, opts.crc32) {
            (Some(_), Some(_)) => Whole::Crc32(crc32fast::Hasher::new()),
            _ => Whole::Sha256(Hasher::new()),
        };
        let reader = Arc::new(std::sync::Mutex::new(PartReader::open(
            path.clone(),
            len,
            self.config.part_checksum,
            whole,
        )?));
        // Parts are read (and the whole file hashed) in order, one at a time, in a blocking
        // task; up to `part_concurrency` of them are on the wire at once.
        let parts = futures::stream::iter(1..=n_parts)
            .then(|n| {
                let reader = Arc::clone(&reader);
                let budget = Arc::clone(&self.part_budget);
                async move {
                    // A part is hashed and sent only while it holds a permit of the budget.
                    let permit = budget
                        .acquire_owned()
                        .await
                        .map_err(|_| Error::new(ErrorKind::Cancelled, "part budget closed"))?;
                    let want = part_size.min(len - (n - 1) * part_size);
                    tokio::task::spawn_blocking(move || {
                        let mut r = reader
                            .lock()
                            .map_err(|_| Error::new(ErrorKind::Io, "part reader poisoned"))?;
                        r.next_part(want)
                    })
                    .await
                    .map_err(|e| Error::task("read", e))?
                    .map(|(offset, sum)| (n, offset, want, sum, permit))
                }
            })
            .map_ok(|(n, offset, want, sum, _permit)| {
                let path = path.clone();
                async move {
                    let body = ByteStream::read_from()
                        .path(&path)
                        .offset(offset)
                        .length(Length::Exact(want))
                        .build()
                        .await
                        .map_err(|e| {
                            Error::new(ErrorKind::Io, format!("open {} for upload", path.display()))
                                .with_source(e)
                        })?;
                    let req = self
                        .client
                        .upload_part()
                        .bucket(&self.config.bucket)
                        .key(key)
                        .upload_id(upload_id)
                        .part_number(n as i32)
                        .content_length(want as i64)
                        .body(body);
                    let req = match &sum {
                        PartSum::Crc32c(c) => req.checksum_crc32_c(c),
                        PartSum::Sha256(c) => req.checksum_sha256(c),
                    };
                    // The server checks the part's checksum itself: signing the payload would
                    // hash every byte once more for nothing (kept where the server does not
                    // check).
                    let out = if self.config.verifies_sha256 {
                        req.customize().disable_payload_signing().send().await
                    } else {
                        req.send().await
                    }
                    .map_err(|e| classify(self.what(&format!("upload part {n} of"), key), e))?;
                    let part = CompletedPart::builder()
                        .part_number(n as i32)
                        .set_e_tag(out.e_tag);
                    Ok::<_, Error>(
                        match sum {
                            PartSum::Crc32c(c) => part.checksum_crc32_c(c),
                            PartSum::Sha256(c) => part.checksum_sha256(c),
                        }
                        .build(),
                    )
                }
            })
            .try_buffer_unordered(self.config.part_concurrency)
            .try_collect::<Vec<_>>()
            .await?;
        let mut parts = parts;
        parts.sort_by_key(|p| p.part_number);

        let whole = {
            let mut r = reader
                .lock()
                .map_err(|_| Error::new(ErrorKind::Io, "part reader poisoned"))?;
            r.finish()?
        };
        match (whole, opts.sha256, opts.crc32) {
            (WholeSum::Crc32(got), _, Some(expected)) if got != expected => {
                return Err(Error::corrupt(format!(
                    "{}: the file's CRC-32 was {got:08x} while being sent, {expected:08x} at the scan (it changed); upload aborted",
                    self.what("put", key)
                )));
            }
            (WholeSum::Sha256(got), Some(expected), _) if got != expected => {
                return Err(Error::corrupt(format!(
                    "{}: the file hashed to {got} while being sent, expected {expected} (it changed); upload aborted",
                    self.what("put", key)
                )));
            }
            _ => {}
        }
        let mut complete = self
            .client
            .complete_multipart_upload()
            .bucket(&self.config.bucket)
            .key(key)
            .upload_id(upload_id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(parts))
                    .build(),
            );
        if opts.mode == PutMode::CreateOnly {
            complete = complete.if_none_match("*");
        }
        let out = complete
            .send()
            .await
            .map_err(|e| classify(self.what("complete multipart upload", key), e))?;
        Ok(PutResult {
            size: len,
            e_tag: out.e_tag,
            requests: n_parts as u32 + 2,
        })
    }
}

/// The part size for a file of `len` bytes: the configured one, or, for a file too large for
/// [`MAX_PARTS`] parts of it, the smallest whole number of MiB that fits.
fn part_size_for(configured: u64, len: u64) -> u64 {
    configured.max(len.div_ceil(MAX_PARTS).next_multiple_of(1 << 20))
}

/// A part's checksum, base64 as S3 wants it.
enum PartSum {
    Crc32c(String),
    Sha256(String),
}

/// What a [`PartReader`] computes over the whole file.
enum Whole {
    Sha256(Hasher),
    Crc32(crc32fast::Hasher),
}

/// Its result.
enum WholeSum {
    Sha256(Sha256),
    Crc32(u32),
}

/// Reads a file part by part: each part's checksum, and the whole file's SHA-256 or CRC-32.
struct PartReader {
    path: PathBuf,
    file: std::fs::File,
    len: u64,
    algorithm: PartChecksum,
    whole: Whole,
    hashed: u64,
    buf: Vec<u8>,
}

impl PartReader {
    fn open(path: PathBuf, len: u64, algorithm: PartChecksum, whole: Whole) -> Result<Self> {
        let file = std::fs::File::open(&path)
            .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
        Ok(PartReader {
            path,
            file,
            len,
            algorithm,
            whole,
            hashed: 0,
            buf: vec![0u8; 1 << 20],
        })
    }

    /// Read the next `want` bytes through one reused 1 MiB buffer, into the part's checksum
    /// and the whole file's SHA-256; returns the part's offset and checksum. The part itself
    /// is then streamed from the file by the SDK, so no part is ever held in memory.
    fn next_part(&mut self, want: u64) -> Result<(u64, PartSum)> {
        use base64::Engine as _;
        let offset = self.hashed;
        let mut sha = (self.algorithm == PartChecksum::Sha256).then(Hasher::new);
        let mut crc = 0u32;
        let mut left = want;
        while left > 0 {
            let n = (left as usize).min(self.buf.len());
            let got = self
                .file
                .read(&mut self.buf[..n])
                .map_err(|e| Error::io(format!("read {}", self.path.display()), e))?;
            if got == 0 {
                return Err(Error::corrupt(format!(
                    "{} shrank while being uploaded (expected {} bytes)",
                    self.path.display(),
                    self.len
                )));
            }
            match &mut self.whole {
                Whole::Sha256(h) => h.update(&self.buf[..got]),
                Whole::Crc32(h) => h.update(&self.buf[..got]),
            }
            match &mut sha {
                Some(h) => h.update(&self.buf[..got]),
                None => crc = crc32c::crc32c_append(crc, &self.buf[..got]),
            }
            left -= got as u64;
        }
        self.hashed += want;
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
        Ok((
            offset,
            match sha {
                Some(h) => PartSum::Sha256(h.finish().sha256.to_base64()),
                None => PartSum::Crc32c(b64(&crc.to_be_bytes())),
            },
        ))
    }

    fn finish(&mut self) -> Result<WholeSum> {
        let mut probe = [0u8; 1];
        let extra = self
            .file
            .read(&mut probe)
            .map_err(|e| Error::io(format!("read {}", self.path.display()), e))?;
        if extra != 0 {
            return Err(Error::corrupt(format!(
                "{} grew while being uploaded (expected {} bytes)",
                self.path.display(),
                self.len
            )));
        }
        Ok(
            match std::mem::replace(&mut self.whole, Whole::Crc32(crc32fast::Hasher::new())) {
                Whole::Sha256(h) => WholeSum::Sha256(h.finish().sha256),
                Whole::Crc32(h) => WholeSum::Crc32(h.finalize()),
            },
        )
    }
}

/// How many certificates a PEM bundle holds, each parsed as the TLS layer will parse it (PEM,
/// then DER into a root store); an error when one does not parse or there is none. The TLS
/// layer itself would panic on a bad one at the first connection, or — with none — trust
/// nothing, so that every connection failed as "unknown issuer", far from the cause.
fn pem_certificates(pem: &[u8]) -> std::result::Result<usize, String> {
    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::CertificateDer;
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| format!("not PEM: {e}"))?;
    if certs.is_empty() {
        return Err("no -----BEGIN CERTIFICATE----- block".into());
    }
    let mut roots = rustls::RootCertStore::empty();
    for (i, cert) in certs.iter().enumerate() {
        roots
            .add(cert.clone())
            .map_err(|e| format!("certificate {}: {e}", i + 1))?;
    }
    Ok(certs.len())
}

/// The HTTP client when a setting needs one of our own (a CA bundle, fixed addresses);
/// `None`: the SDK's default.
fn http_client(
    config: &S3Config,
) -> Result<Option<aws_smithy_runtime_api::client::http::SharedHttpClient>> {
    use aws_smithy_http_client::tls;
    if config.ca_bundle.is_none() && config.resolve.is_empty() {
        return Ok(None);
    }
    let mut trust = tls::TrustStore::default();
    if let Some(path) = &config.ca_bundle {
        let pem = std::fs::read(path)
            .map_err(|e| Error::io(format!("read CA bundle {}", path.display()), e))?;
        let certs = pem_certificates(&pem).map_err(|why| {
            Error::invalid(format!(
                "CA bundle {} is not a PEM bundle of certificates: {why}",
                path.display()
            ))
        })?;
        tracing::debug!(bundle = %path.display(), certs, "CA bundle read");
        trust = trust.with_pem_certificate(pem);
    }
    let ctx = tls::TlsContext::builder()
        .with_trust_store(trust)
        .build()
        .map_err(|e| {
            let what = match &config.ca_bundle {
                Some(p) => format!("CA bundle {} is not usable", p.display()),
                None => "the system's TLS roots are not usable".to_owned(),
            };
            Error::invalid(what).with_source(e)
        })?;
    let builder = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::AwsLc,
        ))
        .tls_context(ctx);
    Ok(Some(if config.resolve.is_empty() {
        builder.build_https()
    } else {
        builder.build_with_resolver(FixedAddresses(Arc::new(config.resolve.clone())))
    }))
}

/// The DNS resolver of [`S3Config::resolve`]: listed names at their fixed address, the rest
/// through the system's resolver.
#[derive(Clone, Debug)]
struct FixedAddresses(Arc<BTreeMap<String, IpAddr>>);

impl FixedAddresses {
    fn lookup(&self, name: &str) -> Option<IpAddr> {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        if let Some(ip) = self.0.get(&name) {
            return Some(*ip);
        }
        // The nearest wildcard: for a.b.c, `*.b.c` before `*.c`.
        let mut rest = name.as_str();
        while let Some((_, parent)) = rest.split_once('.') {
            if let Some(ip) = self.0.get(&format!("*.{parent}")) {
                return Some(*ip);
            }
            rest = parent;
        }
        None
    }
}

impl aws_smithy_runtime_api::client::dns::ResolveDns for FixedAddresses {
    fn resolve_dns<'a>(
        &'a self,
        name: &'a str,
    ) -> aws_smithy_runtime_api::client::dns::DnsFuture<'a> {
        use aws_smithy_runtime_api::client::dns::{DnsFuture, ResolveDnsError};
        if let Some(ip) = self.lookup(name) {
            tracing::trace!(name, %ip, "s3.resolve");
            return DnsFuture::ready(Ok(vec![ip]));
        }
        DnsFuture::new(async move {
            tokio::net::lookup_host((name, 0))
                .await
                .map(|addrs| addrs.map(|a| a.ip()).collect())
                .map_err(ResolveDnsError::new)
        })
    }
}

/// Whether an error's cause chain is a TLS certificate verification failure (rustls:
/// "invalid peer certificate: UnknownIssuer", "NotValidForName", expired, …).
fn tls_refused(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if matches!(
            e.downcast_ref::<rustls::Error>(),
            Some(rustls::Error::InvalidCertificate(_))
        ) || e.to_string().contains("invalid peer certificate")
        {
            return true;
        }
        cur = e.source();
    }
    false
}

/// Map an SDK error to a classified [`Error`] (DESIGN §9).
/// An AWS SDK error as blobsnap's: timeouts and unreachable servers `Transient`, HTTP
/// statuses and S3 codes by [`kind_of_status`].
pub fn classify<E>(what: String, err: SdkError<E, HttpResponse>) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match &err {
        SdkError::ConstructionFailure(_) => {
            Error::invalid(format!("{what}: could not build the request")).with_source(err)
        }
        SdkError::TimeoutError(_) => {
            Error::transient(format!("{what}: timed out")).with_source(err)
        }
        SdkError::DispatchFailure(d) => {
            if d.is_user() {
                Error::invalid(format!("{what}: bad request setup (endpoint?)")).with_source(err)
            } else if tls_refused(&err) {
                // The server answered with a certificate this client does not trust: a
                // setting to fix, not a network hiccup to retry.
                Error::new(
                    ErrorKind::Permanent,
                    format!("{what}: the server's TLS certificate is not trusted (set s3.ca-bundle / BLOBSNAP_S3_CA_BUNDLE to the CA that signed it, or check the endpoint's host name)"),
                )
                .with_source(err)
            } else {
                Error::transient(format!("{what}: could not reach the server")).with_source(err)
            }
        }
        SdkError::ResponseError(r) => {
            let status = r.raw().status().as_u16();
            // A success whose body was cut (connection lost mid-response) is ambiguous, not
            // final: the request may well have taken effect. Retry (create-only puts and
            // multipart completes then settle by reading back).
            let kind = if (200..300).contains(&status) {
                ErrorKind::Transient
            } else {
                kind_of_status(status, None)
            };
            Error::new(kind, format!("{what}: unreadable response (HTTP {status})"))
                .with_source(err)
        }
        SdkError::ServiceError(s) => {
            let status = s.raw().status().as_u16();
            let code = s.err().code().map(str::to_string);
            let msg = s.err().message().map(str::to_string);
            let kind = kind_of_status(status, code.as_deref());
            let mut text = format!("{what}: HTTP {status}");
            if let Some(c) = &code {
                text.push_str(&format!(" {c}"));
            }
            if let Some(m) = &msg {
                text.push_str(&format!(" ({m})"));
            }
            match (status, code.as_deref()) {
                (_, Some("NoSuchBucket")) => text.push_str(": the bucket does not exist"),
                (403, _) => text.push_str(
                    ": access denied (credentials, bucket policy; on AWS a missing key also gives 403 without s3:ListBucket)",
                ),
                (301, _) | (_, Some("PermanentRedirect")) | (_, Some("AuthorizationHeaderMalformed")) => {
                    text.push_str(": wrong region for this bucket?")
                }
                _ => {}
            }
            Error::new(kind, text)
        }
        _ => Error::transient(format!("{what}: request failed")).with_source(err),
    }
}

/// The kind of an S3 error response, by error code first, then HTTP status.
pub fn kind_of_status(status: u16, code: Option<&str>) -> ErrorKind {
    match code {
        Some("NoSuchKey") | Some("NoSuchUpload") => return ErrorKind::NotFound,
        Some("NoSuchBucket")
        | Some("AccessDenied")
        | Some("InvalidAccessKeyId")
        | Some("SignatureDoesNotMatch")
        | Some("PermanentRedirect")
        | Some("AuthorizationHeaderMalformed") => return ErrorKind::Permanent,
        Some("PreconditionFailed") => return ErrorKind::Conflict,
        Some("BadDigest")
        | Some("InvalidDigest")
        | Some("XAmzContentSHA256Mismatch")
        | Some("XAmzContentChecksumMismatch") => return ErrorKind::Corrupt,
        Some("SlowDown")
        | Some("RequestTimeout")
        | Some("InternalError")
        | Some("ServiceUnavailable")
        | Some("ConditionalRequestConflict")
        | Some("RequestTimeTooSkewed")
        | Some("OperationAborted") => return ErrorKind::Transient,
        Some("InvalidRange") => return ErrorKind::InvalidInput,
        Some("NotImplemented") => return ErrorKind::Permanent,
        _ => {}
    }
    match status {
        404 => ErrorKind::NotFound,
        501 => ErrorKind::Permanent, // not implemented by this server: retrying cannot help
        412 => ErrorKind::Conflict,
        416 => ErrorKind::InvalidInput,
        408 | 409 | 429 => ErrorKind::Transient,
        500..=599 => ErrorKind::Transient,
        _ => ErrorKind::Permanent,
    }
}

fn to_system_time(t: Option<&aws_smithy_types::DateTime>) -> Option<SystemTime> {
    t.and_then(|t| SystemTime::try_from(*t).ok())
}

/// Parse the total size out of `Content-Range: bytes a-b/total`.
/// What a GET response carries: `(object size, bytes the body carries, bytes asked for)`, or
/// `None` when only a HEAD can tell (no `Content-Range` and no `Content-Length`: a chunked
/// body). A response to a ranged GET without `Content-Range` carries the whole object (the
/// server ignored `Range`): the caller cuts it to the range.
/// `(object size, bytes the body carries, bytes asked for)`.
type Served = (u64, Range<u64>, Range<u64>);

fn served_range(
    key: &BlobKey,
    range: Option<&Range<u64>>,
    content_range: Option<&str>,
    body_len: Option<u64>,
) -> Result<Option<Served>> {
    let (total, served) = match (range, content_range) {
        (Some(_), Some(cr)) => {
            let (served, total) = parse_content_range(cr).ok_or_else(|| {
                Error::transient(format!("get {key}: unparsable Content-Range {cr:?}"))
            })?;
            (total, served)
        }
        (_, _) => match body_len {
            Some(n) => (n, 0..n),
            None => return Ok(None),
        },
    };
    let want = range.cloned().unwrap_or(0..total);
    if want.end > total {
        return Err(Error::invalid(format!(
            "range {want:?} is outside object {key} of {total} bytes"
        )));
    }
    if served != want && !(served.start == 0 && served.end == total) {
        return Err(Error::transient(format!(
            "get {key}: asked for bytes {want:?}, the server sent {served:?}"
        )));
    }
    Ok(Some((total, served, want)))
}

/// `bytes FIRST-LAST/TOTAL` → (FIRST..LAST+1, TOTAL).
fn parse_content_range(cr: &str) -> Option<(Range<u64>, u64)> {
    let rest = cr.trim().strip_prefix("bytes")?.trim_start();
    let (span, total) = rest.split_once('/')?;
    let (first, last) = span.split_once('-')?;
    let (first, last, total): (u64, u64, u64) = (
        first.trim().parse().ok()?,
        last.trim().parse().ok()?,
        total.trim().parse().ok()?,
    );
    (first <= last && last < total).then(|| (first..last + 1, total))
}

/// The slowest body accepted: at least `min_bytes_per_sec` on average over every `window`.
#[derive(Clone, Copy, Debug)]
struct Pace {
    window: Duration,
    min_bytes_per_sec: u64,
}

impl Pace {
    fn new(window: Duration, min_bytes_per_sec: u64) -> Self {
        Pace {
            window: window.max(Duration::from_millis(1)),
            min_bytes_per_sec,
        }
    }

    /// Bytes a window must deliver.
    fn floor(&self) -> u64 {
        (self.min_bytes_per_sec as f64 * self.window.as_secs_f64()) as u64
    }
}

/// A GET body as blobsnap's stream: `skip` bytes dropped (a server that ignored `Range`),
/// then at most `take` bytes, then the connection dropped; each `pace.window` must deliver
/// `pace.floor()` bytes, else `Transient` (a trickling server).
fn body_stream(
    key: BlobKey,
    body: aws_sdk_s3::primitives::ByteStream,
    skip: u64,
    take: u64,
    pace: Pace,
) -> BoxStream<'static, Result<bytes::Bytes>> {
    struct St {
        body: aws_sdk_s3::primitives::ByteStream,
        skip: u64,
        take: u64,
        window_start: tokio::time::Instant,
        in_window: u64,
    }
    let st = St {
        body,
        skip,
        take,
        window_start: tokio::time::Instant::now(),
        in_window: 0,
    };
    futures::stream::try_unfold(st, move |mut st| {
        let key = key.clone();
        async move {
            loop {
                if st.take == 0 {
                    return Ok(None);
                }
                let next = if pace.min_bytes_per_sec > 0 {
                    tokio::time::timeout_at(st.window_start + pace.window, st.body.try_next())
                        .await
                        .ok()
                } else {
                    Some(st.body.try_next().await)
                };
                if let Some(Ok(Some(c))) = &next {
                    st.in_window += c.len() as u64;
                }
                if pace.min_bytes_per_sec > 0 && st.window_start.elapsed() >= pace.window {
                    if st.in_window < pace.floor() {
                        return Err(Error::transient(format!(
                            "get {key}: the body came at {} bytes in {:.1}s, under the floor of {} bytes/s (min-body-bytes-per-sec): a stalled or trickling server",
                            st.in_window,
                            st.window_start.elapsed().as_secs_f64(),
                            pace.min_bytes_per_sec
                        )));
                    }
                    st.window_start = tokio::time::Instant::now();
                    st.in_window = 0;
                }
                let Some(next) = next else { continue };
                let mut chunk = match next {
                    Ok(Some(c)) => c,
                    Ok(None) => return Ok(None),
                    Err(e) => {
                        return Err(
                            Error::transient(format!("get {key}: body read failed")).with_source(e)
                        )
                    }
                };
                if st.skip > 0 {
                    let k = st.skip.min(chunk.len() as u64);
                    st.skip -= k;
                    chunk = chunk.slice(k as usize..);
                }
                if chunk.is_empty() {
                    continue;
                }
                if chunk.len() as u64 > st.take {
                    chunk = chunk.slice(..st.take as usize);
                }
                st.take -= chunk.len() as u64;
                return Ok(Some((chunk, st)));
            }
        }
    })
    .boxed()
}

#[async_trait]
impl BlobStore for S3Store {
    fn capabilities(&self) -> Capabilities {
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

    async fn probe_capabilities(&self) -> Result<Capabilities> {
        if self.config.create_only == CreateOnlySetting::Auto {
            // Once per store (and its clones), even when every task asks at once.
            self.probed
                .get_or_try_init(|| async {
                    Ok::<_, Error>(self.probe_create_only().await?.create_only)
                })
                .await?;
        }
        Ok(self.capabilities())
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

    async fn list_multipart_uploads(&self, scope: &Scope) -> Result<Vec<MultipartUpload>> {
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

    async fn abort_multipart_upload(&self, upload: &MultipartUpload) -> Result<()> {
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
    use super::*;

    #[test]
    fn fixed_addresses_exact_before_the_nearest_wildcard() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let r = FixedAddresses(Arc::new(
            [
                ("s3.internal".to_owned(), ip("10.0.0.1")),
                ("*.s3.internal".to_owned(), ip("10.0.0.2")),
                ("*.eu.s3.internal".to_owned(), ip("10.0.0.3")),
                ("state.eu.s3.internal".to_owned(), ip("10.0.0.4")),
            ]
            .into(),
        ));
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
