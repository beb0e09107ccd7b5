package blobsnap;

import java.io.File;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ExecutorService;
import org.apache.samza.config.Config;
import org.apache.samza.config.StorageConfig;
import org.apache.samza.config.TaskConfig;
import org.apache.samza.context.ContainerContext;
import org.apache.samza.context.JobContext;
import org.apache.samza.job.model.ContainerModel;
import org.apache.samza.job.model.JobModel;
import org.apache.samza.job.model.TaskModel;
import org.apache.samza.metrics.MetricsRegistry;
import org.apache.samza.storage.KafkaChangelogRestoreParams;
import org.apache.samza.storage.StateBackendAdmin;
import org.apache.samza.storage.StateBackendFactory;
import org.apache.samza.storage.StorageManagerUtil;
import org.apache.samza.storage.TaskBackupManager;
import org.apache.samza.storage.TaskRestoreManager;
import org.apache.samza.system.SystemAdmin;
import org.apache.samza.util.Clock;

/**
 * blobsnap as a Samza state backend (route 1: blobsnap's engine, through JNI). Its class name is
 * the key of its markers in Samza's CheckpointV2, {@code blobsnap.BlobStoreStateBackendFactory},
 * the key blobsnap's own runtime uses: each reads the other's checkpoints.
 *
 * <pre>
 * stores.counts.backup.factories=blobsnap.BlobStoreStateBackendFactory
 * stores.counts.restore.factories=blobsnap.BlobStoreStateBackendFactory
 * task.checkpoint.factory=blobsnap.BlobsnapCheckpointManagerFactory
 * task.checkpoint.read.versions=2,1
 * task.checkpoint.write.versions=2
 * blobsnap.store.kind=s3
 * blobsnap.s3.bucket=state-backups
 * </pre>
 *
 * With blobsnap's checkpoints ({@link BlobsnapCheckpointManagerFactory}) the CheckpointV2s are
 * blobsnap's commit points and the roots of its garbage collection. Under another checkpoint
 * manager (Kafka's), each upload leaves a <em>prepared</em> history record, a root for the sweep,
 * and Samza's checkpoint is committed into blobsnap's history at {@code cleanUp} or at the next
 * start (docs/samza.md); a start-from ({@code blobsnap.job.start-from}) needs blobsnap's.
 */
public class BlobStoreStateBackendFactory implements StateBackendFactory {
  static final String CHECKPOINT_FACTORY_KEY = "task.checkpoint.factory";

  @Override
  public TaskBackupManager getBackupManager(JobContext jobContext, ContainerModel containerModel, TaskModel taskModel,
      Map<String, SystemAdmin> systemAdmins, ExecutorService backupExecutor, MetricsRegistry metrics, Config config,
      Clock clock, File loggedStoreBaseDir, File nonLoggedStoreBaseDir) {
    boolean prepared = requireCheckpointConfig(config);
    List<String> stores = new StorageConfig(config).getStoresWithBackupFactory(getClass().getName());
    Map<String, File> dirs = storeDirs(stores, taskModel, loggedStoreBaseDir);
    Engine engine = Engine.open(config);
    if (prepared) {
      // What blobsnap's checkpoint manager does at its start: the bucket, its rules and the
      // job's owner record (or, with blobsnap.job.create-resources=false, their validation).
      Native.adminResources(engine.handle, engine.job, engine.jobId, true);
    }
    return new BlobsnapBackupManager(engine, taskModel.getTaskName().getTaskName(), dirs, backupExecutor, prepared);
  }

  @Override
  public TaskRestoreManager getRestoreManager(JobContext jobContext, ContainerContext containerContext,
      TaskModel taskModel, ExecutorService restoreExecutor, MetricsRegistry metrics, Set<String> storesToRestore,
      Config config, Clock clock, File loggedStoreBaseDir, File nonLoggedStoreBaseDir,
      KafkaChangelogRestoreParams kafkaChangelogRestoreParams) {
    requireCheckpointConfig(config);
    Map<String, File> dirs = storeDirs(new ArrayList<>(storesToRestore), taskModel, loggedStoreBaseDir);
    Engine engine = Engine.open(config);
    return new BlobsnapRestoreManager(engine, taskModel.getTaskName().getTaskName(), dirs, restoreExecutor);
  }

  @Override
  public StateBackendAdmin getAdmin(JobModel jobModel, Config config) {
    Engine engine = Engine.open(config);
    return new StateBackendAdmin() {
      @Override
      public void createResources() {
        Native.adminResources(engine.handle, engine.job, engine.jobId, true);
      }

      @Override
      public void validateResources() {
        Native.adminResources(engine.handle, engine.job, engine.jobId, false);
      }
    };
  }

  /** Samza's store dir of each store for the task (where Samza's RocksJava opens it). */
  static Map<String, File> storeDirs(List<String> stores, TaskModel task, File base) {
    StorageManagerUtil util = new StorageManagerUtil();
    Map<String, File> out = new TreeMap<>();
    for (String s : stores) {
      out.put(s, util.getTaskStoreDir(base, s, task.getTaskName(), task.getTaskMode()).getAbsoluteFile());
    }
    return out;
  }

  /**
   * CheckpointV2 writes, and a start-from only under blobsnap's checkpoints (it is applied where
   * the checkpoint manager claims the task). Returns whether the checkpoints are another manager's
   * (then the backup keeps prepared history records).
   */
  static boolean requireCheckpointConfig(Config config) {
    if (!"2".equals(new TaskConfig(config).get("task.checkpoint.write.versions", "").trim())) {
      throw new BlobsnapException("invalid-input", "task.checkpoint.write.versions must be 2 for blobsnap (CheckpointV2"
          + " carries the markers; set task.checkpoint.read.versions=2,1 too)");
    }
    String f = config.get(CHECKPOINT_FACTORY_KEY);
    if (isBlobsnapCheckpoints(f)) {
      return false;
    }
    if (f == null || f.trim().isEmpty()) {
      throw new BlobsnapException("invalid-input", CHECKPOINT_FACTORY_KEY + " is not set: Samza would keep no"
          + " checkpoint, so no restart could find its state; set it to " + BlobsnapCheckpointManagerFactory.class.getName()
          + " (blobsnap keeps the checkpoints) or to Kafka's checkpoint manager (docs/samza.md)");
    }
    String startFrom = config.get("blobsnap.job.start-from");
    if (startFrom != null && !startFrom.trim().isEmpty()) {
      throw new BlobsnapException("invalid-input", "blobsnap.job.start-from is set, but " + CHECKPOINT_FACTORY_KEY
          + " is " + f.trim() + ": a start-from is applied where blobsnap's checkpoint manager claims the task; set "
          + CHECKPOINT_FACTORY_KEY + "=" + BlobsnapCheckpointManagerFactory.class.getName() + " to roll back or fork,"
          + " or remove blobsnap.job.start-from");
    }
    return true;
  }

  /** Whether {@code name} is blobsnap's checkpoint manager factory (or a subclass of it). */
  static boolean isBlobsnapCheckpoints(String name) {
    if (name == null) {
      return false;
    }
    try {
      return BlobsnapCheckpointManagerFactory.class.isAssignableFrom(
          Class.forName(name.trim(), false, BlobStoreStateBackendFactory.class.getClassLoader()));
    } catch (ClassNotFoundException | LinkageError e) {
      return false;
    }
  }

  static String[] flatDirs(Map<String, File> dirs) {
    List<String> out = new ArrayList<>();
    for (Map.Entry<String, File> e : dirs.entrySet()) {
      out.add(e.getKey());
      out.add(e.getValue().getPath());
    }
    return out.toArray(new String[0]);
  }
}
