package blobsnap.samza.job;

import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import org.apache.samza.application.LegacyTaskApplication;
import org.apache.samza.config.MapConfig;
import org.apache.samza.job.ApplicationStatus;
import org.apache.samza.runtime.LocalApplicationRunner;

/**
 * A real Samza 1.8.0 job whose RocksDB store is backed up and restored by Samza's OWN blob-store
 * state backend through {@code blobsnap.samza.S3BlobStoreManager} (route 2): the spike's word
 * count (samza/: one task, {@link LocalApplicationRunner}, the passthrough job coordinator, a
 * line file as durable input, a CheckpointV2 file checkpoint manager), run in a JVM of its own
 * so that a test can SIGKILL it.
 *
 * <pre>java -cp CP blobsnap.samza.job.WordCountJob CONFIG.properties</pre>
 *
 * The config file is what {@link #config} makes (the test writes it). Exits 0 when the job
 * finished (end of stream), 1 when it failed.
 */
public final class WordCountJob {
  public static final String JOB_NAME = "word.count";
  public static final String JOB_ID = "1";
  public static final String STORE = "counts";
  public static final String BLOB_STORE_FACTORY = "org.apache.samza.storage.blobstore.BlobStoreStateBackendFactory";

  private WordCountJob() {}

  /**
   * The job's config.
   *
   * @param work the job's work dir: events, checkpoints, and the store dirs under {@code state/}
   * @param input the line file
   * @param delayMs pause after each line (so that a test can kill the job half way)
   * @param endOfStream whether the input ends (end-of-stream after the last line)
   * @param s3 the {@code blobsnap.s3.*} / {@code blobsnap.store.*} settings
   */
  public static Map<String, String> config(File work, File input, long delayMs, boolean endOfStream,
      Map<String, String> s3) {
    Map<String, String> c = new HashMap<>();
    c.put("job.name", JOB_NAME);
    c.put("job.id", JOB_ID);
    c.put("app.name", JOB_NAME);
    c.put("app.id", JOB_ID);
    // Standalone, one processor, no ZooKeeper, no Kafka (docs/samza.md).
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

    // CheckpointV2 only, in a local file: Samza's blob-store restore reads its markers from V2.
    c.put("task.commit.ms", "300");
    c.put("task.checkpoint.factory", FileCheckpointManagerFactory.class.getName());
    c.put("task.checkpoint.write.versions", "2");
    c.put("task.checkpoint.read.versions", "2,1");
    c.put(FileCheckpointManagerFactory.DIR, new File(work, "checkpoints").getAbsolutePath());

    c.put("serializers.registry.string.class", "org.apache.samza.serializers.StringSerdeFactory");
    c.put("serializers.registry.integer.class", "org.apache.samza.serializers.IntegerSerdeFactory");
    c.put("stores." + STORE + ".factory", "org.apache.samza.storage.kv.RocksDbKeyValueStorageEngineFactory");
    c.put("stores." + STORE + ".key.serde", "string");
    c.put("stores." + STORE + ".msg.serde", "integer");
    // Route 2: Samza's own blob-store backend, through blobsnap's S3BlobStoreManager.
    c.put("stores." + STORE + ".backup.factories", BLOB_STORE_FACTORY);
    c.put("stores." + STORE + ".restore.factories", BLOB_STORE_FACTORY);
    c.put("blob.store.manager.factory", "blobsnap.samza.S3BlobStoreManagerFactory");
    c.putAll(s3);
    // The host's local state: a test deletes state/ to play a new host.
    c.put("job.logged.store.base.dir", new File(work, "state/logged").getAbsolutePath());
    c.put("job.non-logged.store.base.dir", new File(work, "state/non-logged").getAbsolutePath());

    // No JMX server: it would open ports and look up this host's name.
    c.put("job.jmx.enabled", "false");

    c.put(Events.WORK_DIR, work.getAbsolutePath());
    return c;
  }

  public static void write(Map<String, String> config, Path file) throws IOException {
    Properties p = new Properties();
    p.putAll(config);
    try (OutputStream out = Files.newOutputStream(file)) {
      p.store(out, "blobsnap.samza.job.WordCountJob");
    }
  }

  public static void main(String[] args) throws IOException {
    if (args.length != 1) {
      System.err.println("usage: WordCountJob CONFIG.properties");
      System.exit(2);
    }
    Properties p = new Properties();
    try (InputStream in = Files.newInputStream(new File(args[0]).toPath())) {
      p.load(in);
    }
    Map<String, String> c = new HashMap<>();
    for (String k : p.stringPropertyNames()) {
      c.put(k, p.getProperty(k));
    }
    MapConfig config = new MapConfig(c);
    Events.log(config, "job.start pid=" + pid());

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
  static String pid() {
    String name = java.lang.management.ManagementFactory.getRuntimeMXBean().getName();
    int at = name.indexOf('@');
    return at > 0 ? name.substring(0, at) : name;
  }
}
