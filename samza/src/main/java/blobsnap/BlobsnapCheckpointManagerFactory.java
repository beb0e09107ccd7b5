package blobsnap;

import java.util.HashMap;
import java.util.Map;
import org.apache.samza.checkpoint.Checkpoint;
import org.apache.samza.checkpoint.CheckpointManager;
import org.apache.samza.checkpoint.CheckpointManagerFactory;
import org.apache.samza.checkpoint.CheckpointV2;
import org.apache.samza.config.Config;
import org.apache.samza.container.TaskName;
import org.apache.samza.metrics.MetricsRegistry;
import org.apache.samza.serializers.CheckpointV2Serde;

/**
 * Samza's CheckpointV2 in blobsnap's checkpoint store ({@code task.checkpoint.factory}): each
 * task's checkpoints are a dense sequence of create-only documents in the job's scope of the
 * bucket, the same blobsnap's own runtime writes, so {@code blobsnap checkpoints}, {@code
 * restore}, {@code gc}, savepoints and rollback see a Samza job's history with its input
 * offsets. The first read of a task claims it: a zombie container of the task then fails its
 * next checkpoint write ({@code conflict}). The history is trimmed to {@code blobsnap.job.retention}
 * after each write, before the backup manager's cleanUp deletes what left it.
 */
public class BlobsnapCheckpointManagerFactory implements CheckpointManagerFactory {
  @Override
  public CheckpointManager getCheckpointManager(Config config, MetricsRegistry registry) {
    return new Manager(config);
  }

  static final class Manager implements CheckpointManager {
    private final Config config;
    private final CheckpointV2Serde serde = new CheckpointV2Serde();
    /** Task → the native handle of its claim. Guarded by {@code this}. */
    private final Map<TaskName, Long> tasks = new HashMap<>();
    private Engine engine;

    Manager(Config config) {
      this.config = config;
    }

    @Override
    public synchronized void start() {
      if (engine == null) {
        engine = Engine.open(config);
        Native.adminResources(engine.handle, engine.job, engine.jobId, true);
      }
    }

    @Override
    public void register(TaskName taskName) {}

    private synchronized long claimed(TaskName task) {
      start();
      Long h = tasks.get(task);
      if (h == null) {
        h = Native.taskClaim(engine.handle, engine.job, engine.jobId, task.getTaskName());
        tasks.put(task, h);
      }
      return h;
    }

    @Override
    public void writeCheckpoint(TaskName taskName, Checkpoint checkpoint) {
      Native.taskWrite(claimed(taskName), BlobsnapBackupManager.json(checkpoint));
    }

    @Override
    public Checkpoint readLastCheckpoint(TaskName taskName) {
      byte[] json = Native.taskLast(claimed(taskName));
      return json == null ? null : serde.fromBytes(json);
    }

    @Override
    public synchronized void stop() {
      for (long h : tasks.values()) {
        Native.close(h);
      }
      tasks.clear();
      if (engine != null) {
        Native.close(engine.handle);
        engine = null;
      }
    }
  }
}
