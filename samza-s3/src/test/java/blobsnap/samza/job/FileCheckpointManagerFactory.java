package blobsnap.samza.job;

import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.StandardCopyOption;
import org.apache.samza.SamzaException;
import org.apache.samza.checkpoint.Checkpoint;
import org.apache.samza.checkpoint.CheckpointManager;
import org.apache.samza.checkpoint.CheckpointManagerFactory;
import org.apache.samza.checkpoint.CheckpointV2;
import org.apache.samza.config.Config;
import org.apache.samza.container.TaskName;
import org.apache.samza.metrics.MetricsRegistry;
import org.apache.samza.serializers.CheckpointV2Serde;

/**
 * A checkpoint manager for the tests of both routes (samza/ uses it too): it keeps the
 * last CheckpointV2 of each task in {@code <wordcount.checkpoint.dir>/<task>.json}, written to a
 * temp file, fsynced and renamed. Samza 1.8.0's own FileSystemCheckpointManager takes V1 only,
 * and Samza's blob-store restore reads its markers from a CheckpointV2 only. Each write is
 * logged to {@link Events} (after the rename) with its offsets and state checkpoint markers.
 */
public class FileCheckpointManagerFactory implements CheckpointManagerFactory {
  public static final String DIR = "wordcount.checkpoint.dir";

  @Override
  public CheckpointManager getCheckpointManager(Config config, MetricsRegistry registry) {
    String dir = config.get(DIR);
    if (dir == null) {
      throw new SamzaException("config " + DIR + " is not set");
    }
    return new Manager(config, new File(dir));
  }

  public static File file(File root, TaskName task) {
    return new File(root, task.getTaskName().replaceAll("[^A-Za-z0-9_.-]", "_") + ".json");
  }

  static final class Manager implements CheckpointManager {
    private final Config config;
    private final File root;
    private final CheckpointV2Serde serde = new CheckpointV2Serde();

    Manager(Config config, File root) {
      this.config = config;
      this.root = root;
    }

    @Override
    public void start() {
      if (!root.isDirectory() && !root.mkdirs()) {
        throw new SamzaException("cannot create " + root);
      }
    }

    @Override
    public void register(TaskName taskName) {}

    @Override
    public void writeCheckpoint(TaskName taskName, Checkpoint checkpoint) {
      if (!(checkpoint instanceof CheckpointV2)) {
        throw new SamzaException("this checkpoint manager writes CheckpointV2 only, got version "
            + checkpoint.getVersion() + ": set task.checkpoint.write.versions=2");
      }
      CheckpointV2 v2 = (CheckpointV2) checkpoint;
      byte[] bytes = serde.toBytes(v2);
      File target = file(root, taskName);
      File tmp = new File(root, target.getName() + ".tmp");
      try {
        try (FileOutputStream out = new FileOutputStream(tmp)) {
          out.write(bytes);
          out.getFD().sync();
        }
        Files.move(tmp.toPath(), target.toPath(), StandardCopyOption.ATOMIC_MOVE);
      } catch (IOException e) {
        throw new SamzaException("cannot write the checkpoint of " + taskName + " to " + target, e);
      }
      Events.log(config, "checkpoint.write " + v2.getCheckpointId() + " offsets=" + checkpoint.getOffsets().values()
          + " markers=" + v2.getStateCheckpointMarkers());
    }

    @Override
    public Checkpoint readLastCheckpoint(TaskName taskName) {
      File f = file(root, taskName);
      if (!f.isFile()) {
        Events.log(config, "checkpoint.read none");
        return null;
      }
      try {
        CheckpointV2 c = serde.fromBytes(Files.readAllBytes(f.toPath()));
        Events.log(config, "checkpoint.read " + c.getCheckpointId() + " offsets=" + c.getOffsets().values()
            + " markers=" + c.getStateCheckpointMarkers());
        return c;
      } catch (IOException e) {
        throw new SamzaException("cannot read " + f, e);
      }
    }

    @Override
    public void stop() {}
  }
}
