package blobsnap.spike;

import blobsnap.samza.job.Events;

import java.io.File;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutorService;
import org.apache.samza.checkpoint.Checkpoint;
import org.apache.samza.checkpoint.CheckpointId;
import org.apache.samza.checkpoint.CheckpointV2;
import org.apache.samza.config.Config;
import org.apache.samza.config.StorageConfig;
import org.apache.samza.context.ContainerContext;
import org.apache.samza.context.JobContext;
import org.apache.samza.job.model.ContainerModel;
import org.apache.samza.job.model.JobModel;
import org.apache.samza.job.model.TaskMode;
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
 * A state backend that stores nothing: it shows what Samza 1.8.0 hands a backend (the checkpoint
 * dir of each store at snapshot, the markers at restore) and under which key its markers land
 * in CheckpointV2. Its marker for a store is {@code stub:<checkpointId>}.
 */
public class StubStateBackendFactory implements StateBackendFactory {
  @Override
  public TaskBackupManager getBackupManager(JobContext jobContext, ContainerModel containerModel,
      TaskModel taskModel, Map<String, SystemAdmin> systemAdmins, ExecutorService backupExecutor,
      MetricsRegistry metrics, Config config, Clock clock, File loggedStoreBaseDir, File nonLoggedStoreBaseDir) {
    List<String> stores = new StorageConfig(config).getStoresWithBackupFactory(getClass().getName());
    return new Backup(config, taskModel, stores, loggedStoreBaseDir);
  }

  @Override
  public TaskRestoreManager getRestoreManager(JobContext jobContext, ContainerContext containerContext,
      TaskModel taskModel, ExecutorService restoreExecutor, MetricsRegistry metrics, Set<String> storesToRestore,
      Config config, Clock clock, File loggedStoreBaseDir, File nonLoggedStoreBaseDir,
      KafkaChangelogRestoreParams kafkaChangelogRestoreParams) {
    return new Restore(config, taskModel, storesToRestore);
  }

  @Override
  public StateBackendAdmin getAdmin(JobModel jobModel, Config config) {
    return new StateBackendAdmin() {
      @Override
      public void createResources() {}

      @Override
      public void validateResources() {}
    };
  }

  static final class Backup implements TaskBackupManager {
    private final Config config;
    private final TaskModel task;
    private final List<String> stores;
    private final File loggedBase;
    private final StorageManagerUtil util = new StorageManagerUtil();

    Backup(Config config, TaskModel task, List<String> stores, File loggedBase) {
      this.config = config;
      this.task = task;
      this.stores = stores;
      this.loggedBase = loggedBase;
    }

    @Override
    public void init(Checkpoint checkpoint) {
      Events.log(config, "backup.init " + (checkpoint == null ? "none" : "v" + checkpoint.getVersion()));
    }

    @Override
    public Map<String, String> snapshot(CheckpointId id) {
      Map<String, String> markers = new HashMap<>();
      for (String store : stores) {
        File storeDir = util.getTaskStoreDir(loggedBase, store, task.getTaskName(), TaskMode.Active);
        File checkpointDir = new File(util.getStoreCheckpointDir(storeDir, id));
        String[] files = checkpointDir.list();
        if (files != null) {
          Arrays.sort(files);
        }
        Events.log(config, "backup.snapshot " + id + " " + store + " dir=" + checkpointDir
            + " files=" + (files == null ? "MISSING" : Arrays.toString(files)));
        markers.put(store, "stub:" + id);
      }
      return markers;
    }

    @Override
    public CompletableFuture<Map<String, String>> upload(CheckpointId id, Map<String, String> markers) {
      Events.log(config, "backup.upload " + id + " " + markers + " thread=" + Thread.currentThread().getName());
      return CompletableFuture.completedFuture(markers);
    }

    @Override
    public CompletableFuture<Void> cleanUp(CheckpointId id, Map<String, String> markers) {
      Events.log(config, "backup.cleanUp " + id + " " + markers);
      return CompletableFuture.completedFuture(null);
    }

    @Override
    public void close() {}
  }

  static final class Restore implements TaskRestoreManager {
    private final Config config;
    private final TaskModel task;
    private final Set<String> stores;

    Restore(Config config, TaskModel task, Set<String> stores) {
      this.config = config;
      this.task = task;
      this.stores = stores;
    }

    @Override
    public void init(Checkpoint checkpoint) {
      Map<String, String> mine = Collections.emptyMap();
      if (checkpoint instanceof CheckpointV2) {
        Map<String, String> m = ((CheckpointV2) checkpoint).getStateCheckpointMarkers()
            .get(StubStateBackendFactory.class.getName());
        if (m != null) {
          mine = m;
        }
      }
      Events.log(config, "restore.init " + task.getTaskName() + " stores=" + stores + " checkpoint="
          + (checkpoint == null ? "none" : "v" + checkpoint.getVersion()) + " markers=" + mine);
    }

    @Override
    public CompletableFuture<Void> restore() {
      return CompletableFuture.completedFuture(null);
    }

    @Override
    public void close() {}
  }
}
