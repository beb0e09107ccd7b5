//! The bucket's resources: the bucket itself and its lifecycle rules (the admin of a job
//! deployment calls these; it names no AWS type).

use aws_sdk_s3::types::{
    AbortIncompleteMultipartUpload, BucketLifecycleConfiguration, ExpirationStatus, LifecycleRule,
    LifecycleRuleFilter,
};

use super::*;

impl S3Store {
    /// The id of blobsnap's abort-incomplete-multipart rule for the objects under `under`.
    fn rule_id(&self, under: &str) -> String {
        let prefix = format!("{}{}", self.config.prefix, under);
        format!(
            "blobsnap-abort-mpu-{}",
            &Sha256::of(prefix.as_bytes()).to_hex()[..16]
        )
    }

    /// The bucket's lifecycle rules; `None` when the server has no lifecycle API at all
    /// (`NotImplemented`, as s3s-fs answers): then no rule can expire anything either.
    async fn lifecycle_rules(&self) -> Result<Option<Vec<LifecycleRule>>> {
        let s3 = self;
        let bucket = &s3.config().bucket;
        // The raw client has no retry layer: retry here (a reset or a 503 is not an answer).
        crate::blobstore::retry::retry(
            &crate::blobstore::retry::RetryPolicy::default(),
            "read lifecycle rules",
            |_| async move {
                match s3
                    .client()
                    .get_bucket_lifecycle_configuration()
                    .bucket(bucket)
                    .send()
                    .await
                {
                    Ok(out) => Ok(Some(out.rules.unwrap_or_default())),
                    Err(e) if e.code() == Some("NoSuchLifecycleConfiguration") => {
                        Ok(Some(Vec::new()))
                    }
                    Err(e) if e.code() == Some("NotImplemented") => Ok(None),
                    // A 501 whose body was cut on the way (no code to read) is still "not
                    // implemented": the status line says so (found by the fault proxy's cut
                    // responses, `faults::demo_commits_through_a_faulty_wire_s3s`).
                    Err(e) if e.raw_response().is_some_and(|r| r.status().as_u16() == 501) => {
                        Ok(None)
                    }
                    Err(e) => Err(classify(
                        format!("read lifecycle rules of bucket {bucket}"),
                        e,
                    )),
                }
            },
        )
        .await
    }

    /// Create the bucket if it is missing (and the credentials may).
    pub async fn ensure_bucket(&self) -> Result<()> {
        let s3 = self;
        let bucket = &s3.config().bucket;
        let policy = crate::blobstore::retry::RetryPolicy::default();
        // Some(()) = it exists; None = 404. A reset or a 5xx is retried, not taken for 404.
        let exists = crate::blobstore::retry::retry(&policy, "check the bucket", |_| async move {
            match s3.client().head_bucket().bucket(bucket).send().await {
                Ok(_) => Ok(Some(())),
                Err(e) if e.raw_response().map(|r| r.status().as_u16()) == Some(404) => Ok(None),
                Err(e) => Err(classify(format!("check bucket {bucket}"), e)),
            }
        })
        .await?;
        if exists.is_some() {
            return Ok(());
        }
        crate::blobstore::retry::retry(&policy, "create the bucket", |_| async move {
            match s3.client().create_bucket().bucket(bucket).send().await {
                Ok(_) => Ok(()),
                Err(e) if matches!(e.code(), Some("BucketAlreadyOwnedByYou")) => Ok(()),
                Err(e) => Err(classify(
                    format!("bucket {bucket} does not exist and could not be created"),
                    e,
                )),
            }
        })
        .await
    }

    /// Merge (never replace) a lifecycle rule that aborts the incomplete multipart uploads
    /// under `under` (a scope inside the store's prefix) a day after they began.
    pub async fn merge_abort_multipart_rule(&self, under: &str) -> Result<()> {
        let s3 = self;
        if !s3.config().lifecycle {
            tracing::warn!(bucket = %s3.config().bucket, "the server has no lifecycle support: stale multipart uploads are only removed by the sweep");
            return Ok(());
        }
        let id = self.rule_id(under);
        let Some(mut rules) = self.lifecycle_rules().await? else {
            tracing::warn!(bucket = %s3.config().bucket, "the server does not implement lifecycle rules: stale multipart uploads are only removed by the sweep");
            return Ok(());
        };
        if rules.iter().any(|r| r.id() == Some(id.as_str())) {
            return Ok(());
        }
        let prefix = format!("{}{}", s3.config().prefix, under);
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
        let bucket = &s3.config().bucket;
        crate::blobstore::retry::retry(
            &crate::blobstore::retry::RetryPolicy::default(),
            "merge the abort-incomplete-multipart rule",
            |_| {
                let config = config.clone();
                async move {
                    s3.client()
                        .put_bucket_lifecycle_configuration()
                        .bucket(bucket)
                        .lifecycle_configuration(config)
                        .send()
                        .await
                        .map(|_| ())
                        .map_err(|e| {
                            classify(
                                format!(
                                    "merge the abort-incomplete-multipart rule into bucket {bucket}"
                                ),
                                e,
                            )
                        })
                }
            },
        )
        .await
    }

    /// Refuse a lifecycle rule that expires or transitions objects under `under`: it would
    /// delete or freeze live snapshots.
    pub async fn check_no_expiration(&self, under: &str) -> Result<()> {
        let s3 = self;
        if !s3.config().lifecycle {
            return Ok(());
        }
        let ours = format!("{}{}", s3.config().prefix, under);
        for r in self.lifecycle_rules().await?.unwrap_or_default() {
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
}
