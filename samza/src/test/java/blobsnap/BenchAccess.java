package blobsnap;

import java.io.File;
import java.util.Collections;
import java.util.concurrent.ExecutorService;
import org.apache.samza.config.Config;
import org.apache.samza.job.model.TaskModel;
import org.apache.samza.storage.TaskBackupManager;
import org.apache.samza.storage.TaskRestoreManager;

/** Route 1's managers for the bench (blobsnap.bench.RoutesBench), without a container. */
public final class BenchAccess {
  private BenchAccess() {}

  public static TaskBackupManager backup(Config config, TaskModel task, File base, ExecutorService pool) {
    Engine engine = Engine.open(config);
    Native.adminResources(engine.handle, engine.job, engine.jobId, true);
    return new BlobsnapBackupManager(engine, task.getTaskName().getTaskName(),
        BlobStoreStateBackendFactory.storeDirs(Collections.singletonList("counts"), task, base), pool, false);
  }

  public static TaskRestoreManager restore(Config config, TaskModel task, File base, ExecutorService pool) {
    Engine engine = Engine.open(config);
    return new BlobsnapRestoreManager(engine, task.getTaskName().getTaskName(),
        BlobStoreStateBackendFactory.storeDirs(Collections.singletonList("counts"), task, base), pool);
  }
}
