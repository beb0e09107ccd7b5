package blobsnap.samza;

import java.util.concurrent.ExecutorService;
import org.apache.samza.config.Config;
import org.apache.samza.storage.blobstore.BlobStoreManager;
import org.apache.samza.storage.blobstore.BlobStoreManagerFactory;

/**
 * Named by {@code blob.store.manager.factory=blobsnap.samza.S3BlobStoreManagerFactory}: Samza's
 * {@code BlobStoreStateBackendFactory} makes one manager per task for backup and one for
 * restore, each with the executor it hands in; they share one S3 client and one I/O pool per
 * process ({@link S3Transport}). Bad {@code blobsnap.*} settings fail here, with a
 * {@code ConfigException} naming the key.
 */
public class S3BlobStoreManagerFactory implements BlobStoreManagerFactory {
  @Override
  public BlobStoreManager getBackupBlobStoreManager(Config config, ExecutorService backupExecutor) {
    return new S3BlobStoreManager(S3Settings.fromConfig(config), backupExecutor);
  }

  @Override
  public BlobStoreManager getRestoreBlobStoreManager(Config config, ExecutorService restoreExecutor) {
    return new S3BlobStoreManager(S3Settings.fromConfig(config), restoreExecutor);
  }
}
