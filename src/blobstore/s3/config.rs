//! The S3 store's settings: `[s3]`, plain data.

use super::*;

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
    /// the first time fencing matters ([`BlobStore::capabilities`] with [`Probe::IfUnknown`](crate::blobstore::Probe::IfUnknown)). Until then the
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
        if let Some(ep) = &self.endpoint {
            // Checked here, not by the first request: the SDK's "not a valid URI" is a
            // dispatch failure, retried as transient for the whole budget (found with a
            // Samza config whose `# comment` became part of the value).
            let host = ep
                .strip_prefix("http://")
                .or_else(|| ep.strip_prefix("https://"))
                .map(|rest| rest.split(['/', '?', '#']).next().unwrap_or(""));
            if ep.chars().any(|c| c.is_whitespace() || c.is_control())
                || host.is_none_or(str::is_empty)
            {
                return Err(Error::invalid(format!(
                    "s3 endpoint {ep:?} is not a URL: expected http://HOST[:PORT] or https://HOST[:PORT] (a `# comment` after a value in a .properties file becomes part of the value)"
                )));
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_that_is_not_a_url_is_refused_before_any_request() {
        let with = |ep: &str| S3Config {
            bucket: "state-backups".into(),
            endpoint: Some(ep.into()),
            ..Default::default()
        };
        for ok in [
            "http://127.0.0.1:9000",
            "https://s3.example.test",
            "http://[::1]:9000/",
        ] {
            with(ok).validate().unwrap();
        }
        for bad in [
            "http://127.0.0.1:31530   # S3-compatible servers; default: AWS",
            "127.0.0.1:9000",
            "ftp://host",
            "http://",
            "",
        ] {
            let e = with(bad).validate().unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::InvalidInput, "{bad:?}: {e}");
            assert!(e.to_string().contains("is not a URL"), "{e}");
        }
    }
}
