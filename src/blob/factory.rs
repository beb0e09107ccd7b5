//! The blob backend's [`StateBackendFactory`]: how a runtime that knows only the SPI gets the
//! blob backend's managers — the job runtime ([`crate::job::run_task`]) builds every manager
//! through it. Markers go under [`FACTORY_NAME`].

use std::sync::Arc;

use super::collect::admin::BlobStoreAdmin;
use super::commit::backup::{BackupSettings, BlobBackupManager};
use super::restore::{BlobRestoreManager, RestoreSettings};
use super::snapshot::FACTORY_NAME;
use crate::backend::{
    Clock, StateBackendAdmin, StateBackendFactory, StoreSpec, TaskBackupManager, TaskContext,
    TaskRestoreManager,
};
use crate::blobstore::s3::S3Store;
use crate::blobstore::BlobStore;
use crate::error::Result;

/// Builds the blob backend's managers over one blob store.
pub struct BlobStateBackendFactory {
    store: Arc<dyn BlobStore>,
    s3: Option<S3Store>,
    backup: BackupSettings,
    restore: RestoreSettings,
    deployment_id: String,
}

impl std::fmt::Debug for BlobStateBackendFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BlobStateBackendFactory({})", self.store)
    }
}

impl BlobStateBackendFactory {
    /// A factory over `store` (`s3`: the raw S3 store behind it, for the admin's bucket
    /// calls), for deployment `deployment_id`.
    pub fn new(
        store: Arc<dyn BlobStore>,
        s3: Option<S3Store>,
        backup: BackupSettings,
        restore: RestoreSettings,
        deployment_id: impl Into<String>,
    ) -> Self {
        BlobStateBackendFactory {
            store,
            s3,
            backup,
            restore,
            deployment_id: deployment_id.into(),
        }
    }
}

impl StateBackendFactory for BlobStateBackendFactory {
    fn name(&self) -> &str {
        FACTORY_NAME
    }

    fn backup_manager(
        &self,
        task: &TaskContext,
        stores: &[StoreSpec],
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<dyn TaskBackupManager>> {
        Ok(Arc::new(BlobBackupManager::new(
            Arc::clone(&self.store),
            task.clone(),
            stores,
            clock,
            self.backup.clone(),
        )?))
    }

    fn restore_manager(
        &self,
        task: &TaskContext,
        stores: &[StoreSpec],
        _clock: Arc<dyn Clock>,
    ) -> Result<Arc<dyn TaskRestoreManager>> {
        Ok(Arc::new(BlobRestoreManager::new(
            Arc::clone(&self.store),
            task.clone(),
            stores,
            self.restore.clone(),
        )?))
    }

    fn admin(&self, job_name: &str, job_id: &str) -> Result<Arc<dyn StateBackendAdmin>> {
        // The scope records the grace its writers abandon by: a sweep of that scope is then
        // held to it (never to a default floor).
        Ok(Arc::new(
            BlobStoreAdmin::new(
                Arc::clone(&self.store),
                self.s3.clone(),
                job_name,
                job_id,
                &self.deployment_id,
            )?
            .with_gc_grace(self.backup.gc_grace),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::SystemClock;
    use crate::blobstore::local::LocalStore;

    #[tokio::test]
    async fn factory_builds_working_managers_through_the_spi() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn BlobStore> = Arc::new(LocalStore::new(dir.path().join("s")).unwrap());
        let f = BlobStateBackendFactory::new(
            store,
            None,
            BackupSettings::default(),
            RestoreSettings::default(),
            "d1",
        );
        assert_eq!(f.name(), "blobsnap.BlobStoreStateBackendFactory");
        let task = TaskContext {
            job_name: "j".into(),
            job_id: "1".into(),
            task_name: "t".into(),
        };
        let spec = StoreSpec {
            name: "s".into(),
            dir: dir.path().join("store"),
        };
        let cp = dir.path().join("cp");
        std::fs::create_dir_all(&cp).unwrap();
        std::fs::write(cp.join("CURRENT"), b"x").unwrap();
        let b = f
            .backup_manager(&task, std::slice::from_ref(&spec), Arc::new(SystemClock))
            .unwrap();
        b.init(None).await.unwrap();
        let id = "5-0".parse().unwrap();
        let m = b
            .upload(id, &Default::default(), &[("s".to_string(), cp)].into())
            .await
            .unwrap();
        b.cleanup(id, &m).await.unwrap();
        let checkpoint = crate::checkpoint::Checkpoint::V2(crate::checkpoint::CheckpointV2 {
            id,
            input_offsets: Default::default(),
            state_checkpoint_markers: [(FACTORY_NAME.to_string(), m)].into(),
        });
        let r = f
            .restore_manager(&task, std::slice::from_ref(&spec), Arc::new(SystemClock))
            .unwrap();
        r.init(Some(&checkpoint)).await.unwrap();
        r.restore().await.unwrap();
        assert_eq!(std::fs::read(spec.dir.join("CURRENT")).unwrap(), b"x");
        let admin = f.admin("j", "1").unwrap();
        admin.create_resources().await.unwrap();
        admin.validate_resources().await.unwrap();
    }
}
