package blobsnap.spike;

import blobsnap.samza.job.Events;
import blobsnap.samza.job.LineFileSystemFactory;
import blobsnap.samza.job.FileCheckpointManagerFactory;
import blobsnap.samza.job.WordCountTask;

import java.io.File;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import org.apache.samza.application.LegacyTaskApplication;
import org.apache.samza.config.MapConfig;
import org.apache.samza.job.ApplicationStatus;
import org.apache.samza.runtime.LocalApplicationRunner;

/**
 * The spike's Samza job, run in a JVM of its own: one task (word count over a line file) with
 * one RocksDB store, {@link LocalApplicationRunner} and the passthrough job coordinator.
 *
 * <pre>java -cp CP [-Dspike.config.KEY=VALUE...] blobsnap.spike.SpikeJob WORK_DIR INPUT_FILE [DELAY_MS [END_OF_STREAM]]</pre>
 *
 * Exits 0 when the job finished (end of stream), 1 when it failed.
 */
public final class SpikeJob {
  private SpikeJob() {}

  static Map<String, String> config(File work, File input, long delayMs, boolean endOfStream) {
    Map<String, String> c = new HashMap<>();
    c.put("job.name", "spike");
    c.put("job.id", "1");
    c.put("app.name", "spike");
    c.put("app.id", "1");
    // Standalone, one processor, no ZooKeeper, no Kafka.
    c.put("job.coordinator.factory", "org.apache.samza.standalone.PassthroughJobCoordinatorFactory");
    c.put("job.coordination.utils.factory", "org.apache.samza.standalone.PassthroughCoordinationUtilsFactory");
    c.put("processor.id", "0");
    c.put("task.name.grouper.factory", "org.apache.samza.container.grouper.task.SingleContainerGrouperFactory");

    c.put("task.inputs", "lines.input");
    c.put("systems.lines.samza.factory", LineFileSystemFactory.class.getName());
    c.put("systems.lines.path", input.getAbsolutePath());
    c.put("systems.lines.delay.ms", Long.toString(delayMs));
    c.put("systems.lines.end.of.stream", Boolean.toString(endOfStream));
    c.put("systems.lines.samza.offset.default", "oldest");

    c.put("task.commit.ms", "300");
    c.put("task.checkpoint.factory", FileCheckpointManagerFactory.class.getName());
    c.put("task.checkpoint.read.versions", "2,1");
    c.put("task.checkpoint.write.versions", "2");
    c.put(FileCheckpointManagerFactory.DIR, new File(work, "checkpoints").getAbsolutePath());

    c.put("serializers.registry.string.class", "org.apache.samza.serializers.StringSerdeFactory");
    c.put("serializers.registry.integer.class", "org.apache.samza.serializers.IntegerSerdeFactory");
    c.put("stores.counts.factory", "org.apache.samza.storage.kv.RocksDbKeyValueStorageEngineFactory");
    c.put("stores.counts.key.serde", "string");
    c.put("stores.counts.msg.serde", "integer");
    c.put("stores.counts.backup.factories", StubStateBackendFactory.class.getName());
    c.put("stores.counts.restore.factories", StubStateBackendFactory.class.getName());
    c.put("job.logged.store.base.dir", new File(work, "stores-logged").getAbsolutePath());
    c.put("job.non-logged.store.base.dir", new File(work, "stores").getAbsolutePath());

    // No JMX server: it would open ports and look up this host's name (no network in the tests).
    c.put("job.jmx.enabled", "false");

    c.put(Events.WORK_DIR, work.getAbsolutePath());
    return c;
  }

  public static void main(String[] args) {
    if (args.length < 2) {
      System.err.println("usage: SpikeJob WORK_DIR INPUT_FILE [DELAY_MS [END_OF_STREAM]]");
      System.exit(2);
    }
    File work = new File(args[0]);
    File input = new File(args[1]);
    long delayMs = args.length > 2 ? Long.parseLong(args[2]) : 0;
    boolean endOfStream = args.length > 3 && Boolean.parseBoolean(args[3]);
    Map<String, String> c = config(work, input, delayMs, endOfStream);
    // -Dspike.config.KEY=VALUE overrides one config entry, -Dspike.config.KEY= removes it.
    for (String name : System.getProperties().stringPropertyNames()) {
      if (name.startsWith("spike.config.")) {
        String key = name.substring("spike.config.".length());
        String value = System.getProperty(name);
        if (value.isEmpty()) {
          c.remove(key);
        } else {
          c.put(key, value);
        }
      }
    }
    MapConfig config = new MapConfig(c);
    Events.log(config, "job.start pid=" + ProcessHandleCompat.pid());

    LocalApplicationRunner runner =
        new LocalApplicationRunner(new LegacyTaskApplication(WordCountTask.class.getName()), config);
    runner.run();
    runner.waitForFinish(Duration.ofMinutes(10));
    ApplicationStatus status = runner.status();
    Events.log(config, "job.finish " + status.getStatusCode()
        + (status.getThrowable() == null ? "" : " " + status.getThrowable()));
    System.exit(status.getStatusCode() == ApplicationStatus.StatusCode.SuccessfulFinish ? 0 : 1);
  }

  /** The pid on Java 8 too (ProcessHandle is Java 9+, and we compile with --release 8). */
  static final class ProcessHandleCompat {
    private ProcessHandleCompat() {}

    static String pid() {
      String name = java.lang.management.ManagementFactory.getRuntimeMXBean().getName();
      int at = name.indexOf('@');
      return at > 0 ? name.substring(0, at) : name;
    }
  }
}
