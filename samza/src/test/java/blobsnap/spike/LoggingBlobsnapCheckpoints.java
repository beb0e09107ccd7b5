package blobsnap.spike;

import blobsnap.samza.job.Events;

import blobsnap.BlobsnapCheckpointManagerFactory;
import org.apache.samza.checkpoint.Checkpoint;
import org.apache.samza.checkpoint.CheckpointManager;
import org.apache.samza.checkpoint.CheckpointV2;
import org.apache.samza.config.Config;
import org.apache.samza.container.TaskName;
import org.apache.samza.metrics.MetricsRegistry;

/**
 * blobsnap's checkpoint manager, with each checkpoint it wrote (after the write returned) and
 * read logged to the job's event file, so that a test waits for a commit instead of for time.
 */
public class LoggingBlobsnapCheckpoints extends BlobsnapCheckpointManagerFactory {
  @Override
  public CheckpointManager getCheckpointManager(Config config, MetricsRegistry registry) {
    return wrap(super.getCheckpointManager(config, registry), config);
  }

  /** {@code inner}, with each checkpoint it wrote and read logged to the job's event file. */
  static CheckpointManager wrap(CheckpointManager inner, Config config) {
    return new CheckpointManager() {
      @Override
      public void start() {
        inner.start();
      }

      @Override
      public void register(TaskName taskName) {
        inner.register(taskName);
      }

      @Override
      public void createResources() {
        inner.createResources();
      }

      @Override
      public void writeCheckpoint(TaskName taskName, Checkpoint checkpoint) {
        inner.writeCheckpoint(taskName, checkpoint);
        Events.log(config, "checkpoint.write " + ((CheckpointV2) checkpoint).getCheckpointId() + " offsets="
            + checkpoint.getOffsets().values() + " markers=" + ((CheckpointV2) checkpoint).getStateCheckpointMarkers());
      }

      @Override
      public Checkpoint readLastCheckpoint(TaskName taskName) {
        Checkpoint c = inner.readLastCheckpoint(taskName);
        Events.log(config, "checkpoint.read " + (c == null ? "none"
            : ((CheckpointV2) c).getCheckpointId() + " offsets=" + c.getOffsets().values()));
        return c;
      }

      @Override
      public void stop() {
        inner.stop();
      }

      @Override
      public void clearCheckpoints() {
        inner.clearCheckpoints();
      }
    };
  }
}
