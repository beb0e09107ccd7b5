//! The blob backend's [`StateBackendAdmin`]: create and validate what a job deployment needs.
//!
//! - `create_resources`: on S3, create the bucket if it is missing and the caller may; merge
//!   (never replace) a lifecycle rule that aborts incomplete multipart uploads under the job's
//!   prefix; then write the owner record `scope.json` (create-only) naming this deployment.
//! - `validate_resources`: PUT, GET, LIST and DELETE a probe object under the prefix; check that
//!   `scope.json` names this deployment (a scope shared by two deployments would have each one's
//!   cleanup delete the other's blobs); on S3, check that no expiration or transition rule
//!   covers the prefix (it would silently delete or freeze live data). A missing bucket, bad
//!   credentials (403), a wrong region and an unreachable endpoint each fail with a clear,
//!   classified error.

use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_s3::error::ProvideErrorMetadata as _;
use aws_sdk_s3::types::{
    AbortIncompleteMultipartUpload, BucketLifecycleConfiguration, ExpirationStatus, LifecycleRule,
    LifecycleRuleFilter,
};
use bytes::Bytes;
use futures::TryStreamExt as _;
use serde::{Deserialize, Serialize};

use crate::backend::StateBackendAdmin;
use crate::blobstore::s3::S3Store;
use crate::blobstore::{get_bytes, BlobStore, CreateOnly, PutBody, PutOptions};
use crate::digest::Sha256;
use crate::error::{Error, ErrorKind, Result};
use crate::layout::JobScope;

/// The owner record of a job scope.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ScopeRecord {
    /// The deployment that owns the scope.
    pub deployment_id: String,
    /// The job.
    pub job_name: String,
    /// The job's id.
    pub job_id: String,
}

/// The admin of one job deployment.
pub struct BlobStoreAdmin {
    store: Arc<dyn BlobStore>,
    s3: Option<S3Store>,
    job: JobScope,
    record: ScopeRecord,
}

impl std::fmt::Debug for BlobStoreAdmin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobStoreAdmin")
            .field("record", &self.record)
            .finish_non_exhaustive()
    }
}

impl BlobStoreAdmin {
    /// The admin of `job_name`/`job_id` for deployment `deployment_id`. `s3` is the raw S3 store
    /// behind `store` (for bucket and lifecycle calls), if it is one.
    pub fn new(
        store: Arc<dyn BlobStore>,
        s3: Option<S3Store>,
        job_name: &str,
        job_id: &str,
        deployment_id: &str,
    ) -> Result<Self> {
        if deployment_id.trim().is_empty() {
            return Err(Error::invalid("the deployment id must not be blank"));
        }
        Ok(BlobStoreAdmin {
            store,
            s3,
            job: JobScope::new(job_name, job_id)?,
            record: ScopeRecord {
                deployment_id: deployment_id.to_string(),
                job_name: job_name.to_string(),
                job_id: job_id.to_string(),
            },
        })
    }

    fn rule_id(&self, s3: &S3Store) -> String {
        let prefix = format!("{}{}", s3.config().prefix, self.job.scope());
        format!(
            "blobsnap-abort-mpu-{}",
            &Sha256::of(prefix.as_bytes()).to_hex()[..16]
        )
    }

    async fn lifecycle_rules(&self, s3: &S3Store) -> Result<Vec<LifecycleRule>> {
        match s3
            .client()
            .get_bucket_lifecycle_configuration()
            .bucket(&s3.config().bucket)
            .send()
            .await
        {
            Ok(out) => Ok(out.rules.unwrap_or_default()),
            Err(e) if e.code() == Some("NoSuchLifecycleConfiguration") => Ok(Vec::new()),
            Err(e) => Err(Error::new(
                crate::blobstore::s3::kind_of_status(
                    e.raw_response().map(|r| r.status().as_u16()).unwrap_or(0),
                    e.code(),
                ),
                format!(
                    "read lifecycle rules of bucket {}: {}",
                    s3.config().bucket,
                    e.code().unwrap_or("request failed")
                ),
            )),
        }
    }

    async fn create_bucket_if_missing(&self, s3: &S3Store) -> Result<()> {
        let bucket = &s3.config().bucket;
        match s3.client().head_bucket().bucket(bucket).send().await {
            Ok(_) => return Ok(()),
            Err(e) => {
                let status = e.raw_response().map(|r| r.status().as_u16());
                if status != Some(404) {
                    return Err(Error::new(
                        crate::blobstore::s3::kind_of_status(status.unwrap_or(0), e.code()),
                        format!(
                            "check bucket {bucket}: {}",
                            e.code().unwrap_or("request failed")
                        ),
                    )
                    .with_source(e));
                }
            }
        }
        match s3.client().create_bucket().bucket(bucket).send().await {
            Ok(_) => Ok(()),
            Err(e) if matches!(e.code(), Some("BucketAlreadyOwnedByYou")) => Ok(()),
            Err(e) => Err(Error::permanent(format!(
                "bucket {bucket} does not exist and could not be created: {}",
                e.code().unwrap_or("request failed")
            ))),
        }
    }

    async fn merge_lifecycle_rule(&self, s3: &S3Store) -> Result<()> {
        if !s3.config().lifecycle {
            tracing::warn!(bucket = %s3.config().bucket, "the server has no lifecycle support: stale multipart uploads are only removed by the sweep");
            return Ok(());
        }
        let id = self.rule_id(s3);
        let mut rules = self.lifecycle_rules(s3).await?;
        if rules.iter().any(|r| r.id() == Some(id.as_str())) {
            return Ok(());
        }
        let prefix = format!("{}{}", s3.config().prefix, self.job.scope());
        let rule = LifecycleRule::builder()
            .id(&id)
            .filter(LifecycleRuleFilter::builder().prefix(prefix).build())
            .status(ExpirationStatus::Enabled)
            .abort_incomplete_multipart_upload(
                AbortIncompleteMultipartUpload::builder()
                    .days_after_initiation(1)
                    .build(),
            )
            .build()
            .map_err(|e| Error::invalid(format!("lifecycle rule: {e}")))?;
        rules.push(rule);
        let config = BucketLifecycleConfiguration::builder()
            .set_rules(Some(rules))
            .build()
            .map_err(|e| Error::invalid(format!("lifecycle configuration: {e}")))?;
        s3.client()
            .put_bucket_lifecycle_configuration()
            .bucket(&s3.config().bucket)
            .lifecycle_configuration(config)
            .send()
            .await
            .map_err(|e| {
                Error::permanent(format!(
                    "merge the abort-incomplete-multipart rule into bucket {}: {}",
                    s3.config().bucket,
                    e.code().unwrap_or("request failed")
                ))
            })?;
        Ok(())
    }

    async fn check_no_expiration(&self, s3: &S3Store) -> Result<()> {
        if !s3.config().lifecycle {
            return Ok(());
        }
        let ours = format!("{}{}", s3.config().prefix, self.job.scope());
        for r in self.lifecycle_rules(s3).await? {
            if r.status() != &ExpirationStatus::Enabled {
                continue;
            }
            let rule_prefix = r
                .filter()
                .and_then(|f| f.prefix())
                .or(
                    #[allow(deprecated)]
                    r.prefix(),
                )
                .unwrap_or("");
            let covers = ours.starts_with(rule_prefix) || rule_prefix.starts_with(&ours);
            let dangerous = r.expiration().is_some()
                || !r.transitions().is_empty()
                || r.noncurrent_version_expiration().is_some();
            if covers && dangerous {
                return Err(Error::permanent(format!(
                    "lifecycle rule {:?} of bucket {} expires or transitions objects under {ours:?}: it would delete or freeze live snapshots; scope it away from the prefix",
                    r.id().unwrap_or("(no id)"),
                    s3.config().bucket
                )));
            }
        }
        Ok(())
    }

    async fn read_record(&self) -> Result<Option<ScopeRecord>> {
        let key = self.job.owner_record()?;
        match get_bytes(self.store.as_ref(), &key, 1 << 20).await {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| Error::corrupt(format!("{key}: {e}"))),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn check_owner(&self, found: &ScopeRecord) -> Result<()> {
        if found.deployment_id != self.record.deployment_id {
            return Err(Error::conflict(format!(
                "scope {} belongs to deployment {:?}, not {:?}: two deployments must not share a job scope",
                self.job.scope(),
                found.deployment_id,
                self.record.deployment_id
            )));
        }
        Ok(())
    }
}

#[async_trait]
impl StateBackendAdmin for BlobStoreAdmin {
    async fn create_resources(&self) -> Result<()> {
        if let Some(s3) = &self.s3 {
            self.create_bucket_if_missing(s3).await?;
            self.merge_lifecycle_rule(s3).await?;
        }
        let key = self.job.owner_record()?;
        let bytes = serde_json::to_vec(&self.record).map_err(|e| Error::invalid(e.to_string()))?;
        let sha = Sha256::of(&bytes);
        let fenced = self.store.probe_capabilities().await?.create_only == CreateOnly::Atomic;
        if !fenced {
            // The server would let a create-only put overwrite another deployment's record
            // (Garage ignores If-None-Match): look first, and read back after. Two deployments
            // racing on one new scope can still both pass; the sequential case cannot.
            if let Some(found) = self.read_record().await? {
                return self.check_owner(&found);
            }
        }
        let put = match self
            .store
            .put(
                &key,
                PutBody::Bytes(Bytes::from(bytes)),
                PutOptions::create_only(sha),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == ErrorKind::Conflict => match self.read_record().await? {
                Some(found) => self.check_owner(&found),
                None => Err(e),
            },
            Err(e) => Err(e),
        };
        if put.is_ok() && !fenced {
            match self.read_record().await? {
                Some(found) => self.check_owner(&found)?,
                None => {
                    return Err(Error::transient(format!(
                        "scope {}: the owner record just written does not read back",
                        self.job.scope()
                    )))
                }
            }
        }
        put
    }

    async fn validate_resources(&self) -> Result<()> {
        let probe = self
            .job
            .scope()
            .key(&format!("validate-probe-{:016x}", rand::random::<u64>()))?;
        let body = Bytes::from_static(b"blobsnap validate");
        self.store
            .put(&probe, PutBody::Bytes(body.clone()), PutOptions::default())
            .await
            .map_err(|e| e.context("validate: PUT a probe object"))?;
        let back = get_bytes(self.store.as_ref(), &probe, 1 << 20)
            .await
            .map_err(|e| e.context("validate: GET the probe object"))?;
        let listed: Vec<_> = self
            .store
            .list(self.job.scope())
            .try_collect()
            .await
            .map_err(|e| e.context("validate: LIST the job scope"))?;
        let failures = self
            .store
            .delete_many(std::slice::from_ref(&probe))
            .await
            .map_err(|e| e.context("validate: DELETE the probe object"))?;
        if let Some((_, e)) = failures.into_iter().next() {
            return Err(e.context("validate: DELETE the probe object"));
        }
        if back != body || !listed.iter().any(|m| m.key == probe) {
            return Err(Error::permanent(
                "validate: the probe object did not read or list back as written",
            ));
        }
        match self.read_record().await? {
            Some(found) => self.check_owner(&found)?,
            None => {
                return Err(Error::not_found(format!(
                    "scope {} has no owner record (scope.json): run create_resources first",
                    self.job.scope()
                )))
            }
        }
        if let Some(s3) = &self.s3 {
            self.check_no_expiration(s3).await?;
        }
        Ok(())
    }
}
