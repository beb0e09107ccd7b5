//! `blobsnap admin`: create and validate a deployment's resources.

use std::sync::Arc;

use super::args::{open_admin, open_store, store_settings, AdminAction, StoreArgs};

pub(crate) async fn run(
    store_args: &StoreArgs,
    json: bool,
    action: AdminAction,
) -> blobsnap::Result<()> {
    use blobsnap::backend::StateBackendAdmin as _;
    let blob_store = open_store(store_args).await?;
    let settings = store_settings(store_args)?;
    let (d, grace, create) = match &action {
        AdminAction::Create { d, gc_grace_secs } => (
            d,
            Some(gc_grace_secs.unwrap_or(settings.job.gc_grace_secs)),
            true,
        ),
        AdminAction::Validate { d } => (d, None, false),
    };
    let deployment = d
        .deployment
        .clone()
        .unwrap_or_else(|| settings.job.deployment_id.clone());
    let mut adm = open_admin(
        Some(store_args),
        Arc::clone(&blob_store),
        &d.job,
        &d.job_id,
        &deployment,
    )
    .await?;
    if let Some(g) = grace {
        adm = adm.with_gc_grace(std::time::Duration::from_secs(g));
    }
    if create {
        adm.create_resources().await?;
    }
    adm.validate_resources().await?;
    let what = if create { "created and valid" } else { "valid" };
    if json {
        println!(
            "{}",
            serde_json::json!({"schema": 1, "job": d.job, "job-id": d.job_id, "deployment": deployment, "store": blob_store.to_string(), "result": what})
        );
    } else {
        println!(
            "{}/{} (deployment {deployment:?}) on {blob_store}: {what}",
            d.job, d.job_id
        );
    }
    Ok(())
}
