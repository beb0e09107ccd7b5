//! The bucket's resources: the bucket itself and its lifecycle rules (the admin of a job
//! deployment calls these; it names no AWS type).

use aws_sdk_s3::types::{
    AbortIncompleteMultipartUpload, BucketLifecycleConfiguration, ExpirationStatus, LifecycleRule,
    LifecycleRuleFilter,
};

use super::*;

/// The merges of this process take turns: see `S3Store::merge_abort_multipart_rule`.
static MERGES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// PUTs a merge makes before it gives up confirming its rule (with a growing pause between).
const MERGE_ATTEMPTS: u32 = 5;

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
    ///
    /// A bucket's lifecycle configuration is one document that S3 can only replace whole, with
    /// no conditional write: the merge is a read-modify-write. Two merges of one process take
    /// turns (a process-wide async mutex), and every merge reads the document back after its PUT and merges
    /// again if its rule is not there (another process replaced the document in between), up
    /// to 5 PUTs. What S3 cannot give is a merge that no writer in *another*
    /// process overwrites after this read-back; such a lost rule costs only the early abort
    /// of stale uploads (the sweep removes them after its grace) and the next
    /// `create_resources` puts it back.
    pub async fn merge_abort_multipart_rule(&self, under: &str) -> Result<()> {
        let s3 = self;
        if !s3.config().lifecycle {
            tracing::warn!(bucket = %s3.config().bucket, "the server has no lifecycle support: stale multipart uploads are only removed by the sweep");
            return Ok(());
        }
        let id = self.rule_id(under);
        // The one lock of this module, held across the read, the PUT and the read-back: it
        // guards no memory, only the order of this process's rewrites of one remote document;
        // nothing else is taken under it.
        let _turn = MERGES.lock().await;
        for attempt in 0..=MERGE_ATTEMPTS {
            let Some(rules) = self.lifecycle_rules().await? else {
                tracing::warn!(bucket = %s3.config().bucket, "the server does not implement lifecycle rules: stale multipart uploads are only removed by the sweep");
                return Ok(());
            };
            if rules.iter().any(|r| r.id() == Some(id.as_str())) {
                return Ok(());
            }
            if attempt == MERGE_ATTEMPTS {
                break;
            }
            if attempt > 0 {
                tracing::info!(bucket = %s3.config().bucket, rule = %id, attempt, "the lifecycle rule is not in the configuration read back (another writer replaced it, or the server shows it late): merging again");
                tokio::time::sleep(std::time::Duration::from_millis(200 << attempt)).await;
            }
            self.put_merged_rule(rules, &id, under).await?;
        }
        tracing::warn!(bucket = %s3.config().bucket, rule = %id, "the abort-incomplete-multipart rule is not in the bucket's lifecycle configuration after {MERGE_ATTEMPTS} merges (another writer keeps replacing it): stale multipart uploads are removed by the sweep meanwhile, and the next `blobsnap admin create` (or job start) merges it again");
        Ok(())
    }

    /// PUT `rules` with the abort-incomplete-multipart rule `id` for `under` added.
    async fn put_merged_rule(
        &self,
        mut rules: Vec<LifecycleRule>,
        id: &str,
        under: &str,
    ) -> Result<()> {
        let s3 = self;
        let prefix = format!("{}{}", s3.config().prefix, under);
        let rule = LifecycleRule::builder()
            .id(id)
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
