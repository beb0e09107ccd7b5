package blobsnap.samza;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.File;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.TimeUnit;
import org.apache.samza.Partition;
import org.apache.samza.checkpoint.CheckpointId;
import org.apache.samza.checkpoint.CheckpointV2;
import org.apache.samza.config.Config;
import org.apache.samza.config.MapConfig;
import org.apache.samza.container.TaskName;
import org.apache.samza.context.JobContext;
import org.apache.samza.context.JobContextImpl;
import org.apache.samza.job.model.ContainerModel;
import org.apache.samza.job.model.JobModel;
import org.apache.samza.job.model.TaskModel;
import org.apache.samza.metrics.MetricsRegistryMap;
import org.apache.samza.serializers.CheckpointV2Serde;
import org.apache.samza.storage.TaskBackupManager;
import org.apache.samza.storage.blobstore.BlobStoreStateBackendFactory;
import org.apache.samza.util.SystemClock;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import software.amazon.awssdk.services.s3.S3Client;

/**
 * Cross-engine proof: Samza 1.8.0's OWN blob-store engine writes (its
 * {@code BlobStoreBackupManager} through {@link S3BlobStoreManager}), and blobsnap's command-line
 * binary reads — {@code restore}, {@code verify --deep} and {@code inspect --json} of the marker
 * Samza's CheckpointV2 holds, byte for byte. Then one blob is overwritten in the bucket with other
 * bytes of the same length (so only a hash can tell: plain {@code verify} checks sizes by HEAD),
 * and blobsnap's {@code verify --deep} must exit 4 (corrupt) with a problem naming the file, and
 * its {@code restore} must fail the same way. And {@code blobsnap gc} sweeps the job scope by the
 * history this manager keeps of Samza's commits, and refuses a scope whose owner record has none.
 *
 * <p>The binary is the system property {@code blobsnap.bin} (surefire sets it from the variable
 * {@code BLOBSNAP_BIN}, or {@code mvn -Dblobsnap.bin=...}); without it the test FAILS, it is never
 * skipped.
 */
class BlobsnapReadsSamzaTest {
  static final String JOB = "word.count"; // the dot is percent-encoded in the key: word%2Ecount
  static final String JOB_ID = "1";
  static final String TASK = "Partition 0"; // the space too: Partition%200
  static final String STORE = "counts";
  static final String FACTORY = BlobStoreStateBackendFactory.class.getName();
  /** A subprocess of the binary is killed, and the test fails, after this long. */
  static final long TIMEOUT_SECONDS = 180;

  static final String HOW = "blobsnap's binary is not given: set the system property blobsnap.bin, e.g.\n"
      + "  BLOBSNAP_BIN=/path/to/target/debug/blobsnap mvn -B test\n"
      + "or mvn -B test -Dblobsnap.bin=/path/to/target/debug/blobsnap (build it with `cargo build` at the"
      + " repository's root; CARGO_TARGET_DIR may move it). The test fails, never skips, without it";

  static S3Client raw;
  static String bucket;
  static ExecutorService commitPool;

  @TempDir
  Path tmp;

  @BeforeAll
  static void setUp() {
    raw = S3Test.rawClient();
    bucket = S3Test.newBucket(raw, "cross");
    commitPool = SamzaEngineTest.pool("Samza Task Commit Thread-");
  }

  @AfterAll
  static void tearDown() throws InterruptedException {
    if (commitPool != null) {
      commitPool.shutdown();
      commitPool.awaitTermination(5, TimeUnit.SECONDS);
    }
    if (raw != null) {
      raw.close();
    }
  }

  /** The blobsnap binary; fails the test (with how to set it) when none is given or usable. */
  static Path blobsnapBin() {
    String v = System.getProperty("blobsnap.bin");
    if (v == null || v.trim().isEmpty() || v.startsWith("${")) {
      throw new AssertionError(HOW);
    }
    Path bin = Paths.get(v.trim()).toAbsolutePath();
    if (!Files.isRegularFile(bin) || !Files.isExecutable(bin)) {
      throw new AssertionError("blobsnap.bin=" + v + ": no executable file there\n" + HOW);
    }
    return bin;
  }

  static String scope(String prefix) {
    return prefix + "word%2Ecount/1/tasks/Partition%200/stores/counts/";
  }

  static Config config(String prefix) {
    Map<String, String> c = new HashMap<>();
    c.put("job.name", JOB);
    c.put("job.id", JOB_ID);
    c.put("stores." + STORE + ".factory", "org.apache.samza.storage.kv.RocksDbKeyValueStorageEngineFactory");
    c.put("stores." + STORE + ".backup.factories", FACTORY);
    c.put("stores." + STORE + ".restore.factories", FACTORY);
    c.put("blob.store.manager.factory", S3BlobStoreManagerFactory.class.getName());
    c.put(S3Settings.BUCKET, bucket);
    c.put(S3Settings.PREFIX, prefix);
    c.put(S3Settings.ENDPOINT, S3Test.endpoint().toString());
    c.put(S3Settings.REGION, S3Test.region());
    c.put(S3Settings.PATH_STYLE, "true");
    c.put(S3Settings.MAX_TRANSFERS, "4");
    return new MapConfig(c);
  }

  /** What Samza's engine backed up: the checkpoint dir, the marker, and Samza's index. */
  static final class Backup {
    final Path dir;
    final String marker;
    final JsonNode index;

    Backup(Path dir, String marker, JsonNode index) {
      this.dir = dir;
      this.marker = marker;
      this.index = index;
    }
  }

  /**
   * One commit of Samza's real engine (BlobStoreStateBackendFactory → BlobStoreBackupManager →
   * our manager) of a RocksDB-like checkpoint dir under {@code prefix}; returns the marker as it
   * comes back out of the CheckpointV2 Samza would write.
   */
  Backup samzaBackup(String prefix) throws Exception {
    Config config = config(prefix);
    TaskName taskName = new TaskName(TASK);
    TaskModel taskModel = new TaskModel(taskName, Collections.emptySet(), new Partition(0));
    ContainerModel container = new ContainerModel("0", Collections.singletonMap(taskName, taskModel));
    JobContext jobContext = JobContextImpl.fromConfigWithDefaults(config,
        new JobModel(config, Collections.singletonMap("0", container)));
    BlobStoreStateBackendFactory samza = new BlobStoreStateBackendFactory();

    Path base = tmp.resolve("state");
    Path nonLogged = tmp.resolve("non-logged");
    Files.createDirectories(nonLogged);
    CheckpointId cid = CheckpointId.create();
    Path cp = base.resolve(STORE).resolve("Partition_0-" + cid.serialize());
    byte[] every = new byte[4096];
    for (int i = 0; i < every.length; i++) {
      every[i] = (byte) i; // every byte value, 16 times
    }
    SamzaEngineTest.write(cp.resolve("000007.sst"), SamzaEngineTest.random(6000, 7));
    SamzaEngineTest.write(cp.resolve("000008.sst"), every);
    SamzaEngineTest.write(cp.resolve("000009.log"), new byte[0]); // an empty WAL
    SamzaEngineTest.write(cp.resolve("MANIFEST-000001"), SamzaEngineTest.random(1500, 1));
    SamzaEngineTest.write(cp.resolve("CURRENT"), "MANIFEST-000001\n".getBytes(StandardCharsets.UTF_8));
    SamzaEngineTest.write(cp.resolve("OPTIONS-000005"),
        "[Version]\n  rocksdb_version=7.0.3\n  options_file_version=1.1\n".getBytes(StandardCharsets.UTF_8));
    SamzaEngineTest.write(cp.resolve("blob_dir/000001.blob"), SamzaEngineTest.random(2048, 2)); // a sub dir

    TaskBackupManager backup = samza.getBackupManager(jobContext, container, taskModel, Collections.emptyMap(),
        commitPool, new MetricsRegistryMap(), config, SystemClock.instance(), base.toFile(), nonLogged.toFile());
    backup.init(null);
    backup.snapshot(cid);
    Map<String, String> scm = backup.upload(cid, Collections.emptyMap()).get(120, TimeUnit.SECONDS);
    // The marker as Samza's CheckpointV2 holds it under the blob-store factory, through Samza's serde.
    CheckpointV2 written = new CheckpointV2(cid, Collections.emptyMap(), Collections.singletonMap(FACTORY, scm));
    CheckpointV2Serde serde = new CheckpointV2Serde();
    CheckpointV2 read = serde.fromBytes(serde.toBytes(written));
    String marker = read.getStateCheckpointMarkers().get(FACTORY).get(STORE);
    assertTrue(SamzaEngineTest.MARKER.matcher(marker).matches(), marker);
    backup.cleanUp(cid, scm).get(120, TimeUnit.SECONDS);
    backup.close();
    JsonNode index = new ObjectMapper().readTree(S3Test.getRaw(raw, bucket, scope(prefix) + marker));
    return new Backup(cp, marker, index);
  }

  /** A finished run of the binary. */
  static final class Run {
    final List<String> command;
    final int exit;
    final String stdout;
    final String stderr;
    final long millis;

    Run(List<String> command, int exit, String stdout, String stderr, long millis) {
      this.command = command;
      this.exit = exit;
      this.stdout = stdout;
      this.stderr = stderr;
      this.millis = millis;
    }

    @Override
    public String toString() {
      return "blobsnap " + command + " exited " + exit + " after " + millis + " ms\n--- stdout ---\n" + stdout
          + "\n--- stderr ---\n" + stderr;
    }
  }

  /**
   * Runs {@code blobsnap <sub> <args> <store flags>} against the test's bucket and prefix, with
   * LocalStack's credentials in the AWS variables and no other blobsnap setting from the
   * environment; bounded by {@link #TIMEOUT_SECONDS}.
   */
  Run blobsnap(String prefix, String sub, String... args) throws Exception {
    return blobsnapOn(tmp, bucket, prefix, sub, args);
  }

  /** {@code blobsnap SUB ARGS} against {@code bucket} under {@code prefix}, run in a new dir under {@code tmp}. */
  static Run blobsnapOn(Path tmp, String bucket, String prefix, String sub, String... args) throws Exception {
    Path bin = blobsnapBin();
    List<String> cmd = new ArrayList<>();
    cmd.add(bin.toString());
    cmd.add(sub);
    cmd.addAll(Arrays.asList(args));
    cmd.addAll(Arrays.asList("--bucket", bucket, "--s3-endpoint", S3Test.endpoint().toString(), "--s3-region",
        S3Test.region(), "--s3-path-style", "--s3-prefix", prefix));
    Path work = Files.createTempDirectory(tmp, "run-" + sub + "-");
    File out = work.resolve("stdout").toFile();
    File err = work.resolve("stderr").toFile();
    ProcessBuilder pb = new ProcessBuilder(cmd).directory(work.toFile()).redirectOutput(out).redirectError(err)
        .redirectInput(ProcessBuilder.Redirect.from(new File("/dev/null")));
    Map<String, String> env = pb.environment();
    for (Iterator<String> i = env.keySet().iterator(); i.hasNext();) {
      String k = i.next();
      if (k.startsWith("BLOBSNAP_") || k.startsWith("AWS_")) {
        i.remove(); // the flags below are the only store settings; no developer's profile or key
      }
    }
    env.put("AWS_ACCESS_KEY_ID", S3Test.env("BLOBSNAP_TEST_S3_ACCESS_KEY", "test"));
    env.put("AWS_SECRET_ACCESS_KEY", S3Test.env("BLOBSNAP_TEST_S3_SECRET_KEY", "test"));
    env.put("AWS_EC2_METADATA_DISABLED", "true");
    // Empty AWS files of the run's own: no profile of the machine's (and no SDK warning about
    // a missing file).
    env.put("AWS_CONFIG_FILE", Files.createFile(work.resolve("aws-config")).toString());
    env.put("AWS_SHARED_CREDENTIALS_FILE", Files.createFile(work.resolve("aws-credentials")).toString());
    long t0 = System.nanoTime();
    Process p = pb.start();
    boolean done = p.waitFor(TIMEOUT_SECONDS, TimeUnit.SECONDS);
    if (!done) {
      p.destroyForcibly();
      p.waitFor(10, TimeUnit.SECONDS);
    }
    long millis = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0);
    Run run = new Run(cmd.subList(1, cmd.size()), done ? p.exitValue() : -1,
        new String(Files.readAllBytes(out.toPath()), StandardCharsets.UTF_8),
        new String(Files.readAllBytes(err.toPath()), StandardCharsets.UTF_8), millis);
    if (!done) {
      fail("timed out after " + TIMEOUT_SECONDS + " s, killed: " + run);
    }
    System.err.println("[BlobsnapReadsSamzaTest] blobsnap " + sub + ": exit " + run.exit + ", " + millis + " ms");
    return run;
  }

  String[] snapshotFlags(String marker, String... more) {
    List<String> a = new ArrayList<>(Arrays.asList(marker, "--job", JOB, "--job-id", JOB_ID, "--task", TASK,
        "--store", STORE));
    a.addAll(Arrays.asList(more));
    return a.toArray(new String[0]);
  }

  @Test
  void blobsnapRestoresVerifiesAndInspectsWhatSamzasEngineWrote() throws Exception {
    blobsnapBin(); // fail at once, before any upload, without a binary
    String prefix = "good/";
    Backup b = samzaBackup(prefix);
    Map<String, byte[]> original = SamzaEngineTest.tree(b.dir);
    Map<String, String> blobIds = new TreeMap<>();
    SamzaEngineTest.blobIds(b.index.path("dir-index"), "", blobIds);
    assertEquals(7, blobIds.size(), "files in Samza's index: " + blobIds);

    // restore into a fresh dir
    Path to = tmp.resolve("restored-by-blobsnap");
    assertFalse(Files.exists(to));
    Run restore = blobsnap(prefix, "restore", snapshotFlags(b.marker, "--to", to.toString()));
    assertEquals(0, restore.exit, restore.toString());
    Map<String, byte[]> restored = SamzaEngineTest.tree(to);
    assertNotNull(restored.remove("RESTORED"), "blobsnap's complete-restore marker: " + restored.keySet() + "\n"
        + restore);
    assertEquals(original.keySet(), restored.keySet(), "restored tree\n" + restore);
    for (Map.Entry<String, byte[]> e : original.entrySet()) {
      assertArrayEquals(e.getValue(), restored.get(e.getKey()), e.getKey() + "\n" + restore);
    }
    assertTrue(Files.isRegularFile(to.resolve("000009.log")) && Files.size(to.resolve("000009.log")) == 0,
        "the empty file is restored, empty");

    // verify: HEAD of every object, then every blob downloaded and hashed
    Run verify = blobsnap(prefix, "verify", snapshotFlags(b.marker));
    assertEquals(0, verify.exit, verify.toString());
    Run deep = blobsnap(prefix, "verify", snapshotFlags(b.marker, "--deep"));
    assertEquals(0, deep.exit, deep.toString());

    // inspect --json names every file, with its size, the SHA-256 blobsnap derives from the blob
    // key (Samza's index has none) and Samza's blob id
    Run inspect = blobsnap(prefix, "inspect", snapshotFlags(b.marker, "--json"));
    assertEquals(0, inspect.exit, inspect.toString());
    JsonNode doc = new ObjectMapper().readTree(inspect.stdout);
    assertEquals(b.marker, doc.path("marker").asText(), inspect.toString());
    Map<String, JsonNode> listed = new TreeMap<>();
    for (JsonNode f : doc.path("files")) {
      listed.put(f.path("path").asText(), f);
    }
    assertEquals(blobIds.keySet(), listed.keySet(), inspect.toString());
    for (String path : blobIds.keySet()) {
      JsonNode f = listed.get(path);
      Path file = b.dir.resolve(path);
      assertEquals(Files.size(file), f.path("size").asLong(), path + "\n" + inspect);
      assertEquals(SamzaEngineTest.sha(file), f.path("sha256").asText(), path + "\n" + inspect);
      assertEquals(blobIds.get(path), f.path("blob").asText(), path + "\n" + inspect);
    }
    assertEquals(7, doc.path("total-files").asInt(), inspect.toString());
  }

  /** Every object under {@code prefix}: key, size and ETag, in order. */
  static List<String> objects(String prefix) {
    List<String> out = new ArrayList<>();
    for (software.amazon.awssdk.services.s3.model.S3Object o : S3Test.list(raw, bucket, prefix)) {
      out.add(o.key() + "\t" + o.size() + "\t" + o.eTag());
    }
    return out;
  }

  /**
   * blobsnap's sweep finds its roots in blobsnap's history, which this manager keeps for Samza's
   * engine ({@link History}: Samza's checkpoint, committed at its cleanUp). {@code blobsnap gc}
   * sweeps the scope as blobsnap's own — an orphan goes, the committed snapshot stays whole and
   * is listed by {@code checkpoints} — and refuses a scope whose owner record is from before
   * (no {@code "history"}), deleting nothing.
   */
  @Test
  void blobsnapGcSweepsByTheHistoryAndRefusesAScopeWithoutOne() throws Exception {
    blobsnapBin();
    String prefix = "gc/";
    Backup b = samzaBackup(prefix);
    String jobScope = prefix + "word%2Ecount/1/";
    JsonNode record = new ObjectMapper().readTree(S3Test.getRaw(raw, bucket, jobScope + "scope.json"));
    assertEquals(S3BlobStoreManager.ENGINE, record.path("engine").asText(), record.toString());
    assertEquals("prepared", record.path("history").asText(), record.toString());
    // An orphan: a blob of a commit that never happened.
    byte[] junk = SamzaEngineTest.random(1000, 99);
    String orphan = scope(prefix) + "blobs/1700000000000-0/" + S3BlobStoreManager.hex(S3BlobStoreManager.sha256()
        .digest(junk));
    S3Test.putRaw(raw, bucket, orphan, junk);
    S3Test.serverClockPast(raw, bucket, orphan);
    List<String> before = objects(jobScope);
    assertTrue(before.stream().anyMatch(k -> k.startsWith(scope(prefix) + b.marker + "\t")), before.toString());

    Run gc = blobsnap(prefix, "gc", "--job", JOB, "--job-id", JOB_ID, "--grace-secs", "0", "--force");
    assertEquals(0, gc.exit, gc.toString());
    List<String> after = objects(jobScope);
    List<String> expected = new ArrayList<>(before);
    expected.removeIf(k -> k.startsWith(orphan + "\t"));
    assertEquals(expected, after, "gc deleted the orphan and nothing else\n" + gc);
    Run verify = blobsnap(prefix, "verify", snapshotFlags(b.marker));
    assertEquals(0, verify.exit, verify.toString());
    Run cps = blobsnap(prefix, "checkpoints", "--job", JOB, "--job-id", JOB_ID, "--json");
    assertEquals(0, cps.exit, cps.toString());
    assertTrue(cps.stdout.contains(b.marker), "blobsnap's history lists Samza's checkpoint: " + cps);

    // A record of a samza-s3 from before the history: refused, nothing deleted.
    ((com.fasterxml.jackson.databind.node.ObjectNode) record).remove("history");
    S3Test.putRaw(raw, bucket, jobScope + "scope.json", new ObjectMapper().writeValueAsBytes(record));
    S3Test.putRaw(raw, bucket, orphan, junk);
    List<String> legacy = objects(jobScope);
    Run refused = blobsnap(prefix, "gc", "--job", JOB, "--job-id", JOB_ID, "--grace-secs", "0", "--force");
    assertEquals(6, refused.exit, "gc must refuse a scope without a history\n" + refused);
    assertTrue(refused.stderr.contains(S3BlobStoreManager.ENGINE), "stderr names the engine\n" + refused);
    assertEquals(legacy, objects(jobScope), "gc deleted or changed nothing\n" + refused);
  }

  @Test
  void blobsnapVerifyFindsABlobSamzasEngineWroteCorrupted() throws Exception {
    blobsnapBin();
    String prefix = "corrupt/";
    Backup b = samzaBackup(prefix);
    Map<String, String> blobIds = new TreeMap<>();
    SamzaEngineTest.blobIds(b.index.path("dir-index"), "", blobIds);
    String victim = "000007.sst";
    String key = scope(prefix) + blobIds.get(victim);
    byte[] good = S3Test.getRaw(raw, bucket, key);
    assertArrayEquals(Files.readAllBytes(b.dir.resolve(victim)), good);
    byte[] bad = good.clone();
    for (int i = 0; i < bad.length; i++) {
      bad[i] ^= (byte) 0x5a; // other bytes, same length: only a hash can tell
    }
    S3Test.putRaw(raw, bucket, key, bad);
    assertEquals(good.length, S3Test.getRaw(raw, bucket, key).length);

    // verify --deep: exit 4 (corrupt). blobsnap prints each problem, naming the file, on stdout
    // ("  corrupt: <file>: blob <key> has SHA-256 ..., the index says ..."); stderr carries the
    // error ("blobsnap: snapshot <marker> failed verification (1 problems) [corrupt]").
    Run deep = blobsnap(prefix, "verify", snapshotFlags(b.marker, "--deep"));
    assertEquals(4, deep.exit, "exit 4 (corrupt) expected\n" + deep);
    assertTrue(deep.stdout.contains("corrupt: " + victim + ": "), "the problem names the corrupt file " + victim
        + "\n" + deep);
    assertTrue(deep.stderr.contains("failed verification") && deep.stderr.contains("[corrupt]"), deep.toString());
    for (String other : blobIds.keySet()) {
      if (!other.equals(victim)) {
        assertFalse(deep.stdout.contains(" " + other + ": "), "only " + victim + " is corrupt\n" + deep);
      }
    }

    // the same as JSON: one problem, of kind corrupt, about that file
    Run json = blobsnap(prefix, "verify", snapshotFlags(b.marker, "--deep", "--json"));
    assertEquals(4, json.exit, json.toString());
    JsonNode problems = new ObjectMapper().readTree(json.stdout).path("problems");
    assertEquals(1, problems.size(), json.toString());
    assertEquals("corrupt", problems.get(0).path("kind").asText(), json.toString());
    assertTrue(problems.get(0).path("message").asText().startsWith(victim + ": "), json.toString());

    // and a restore of it fails, corrupt, without leaving a restored tree
    Path to = tmp.resolve("restored-corrupt");
    Run restore = blobsnap(prefix, "restore", snapshotFlags(b.marker, "--to", to.toString()));
    assertEquals(4, restore.exit, restore.toString());
    assertTrue(restore.stderr.contains("file " + victim + ","), "the error names the file\n" + restore);
    assertFalse(Files.exists(to.resolve("RESTORED")), restore.toString());
    assertFalse(Files.exists(to.resolve(victim)), restore.toString());
  }
}
