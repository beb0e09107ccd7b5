package blobsnap.samza;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import blobsnap.samza.job.Events;
import blobsnap.samza.job.FileCheckpointManagerFactory;
import blobsnap.samza.job.WordCountJob;
import blobsnap.samza.job.WordCountTask;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.File;
import java.io.IOException;
import java.io.Writer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.apache.samza.Partition;
import org.apache.samza.checkpoint.CheckpointV2;
import org.apache.samza.container.TaskName;
import org.apache.samza.serializers.CheckpointV2Serde;
import org.apache.samza.system.SystemStreamPartition;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import software.amazon.awssdk.services.s3.S3Client;
import software.amazon.awssdk.services.s3.model.S3Object;

/**
 * Route 2 end to end in a REAL Samza 1.8.0 job ({@link WordCountJob}: LocalApplicationRunner,
 * the passthrough coordinator, one task, a RocksDB store, a durable line file, CheckpointV2 in a
 * local file), its store backed up by Samza's own {@code BlobStoreStateBackendFactory} through
 * {@link S3BlobStoreManager} on the test's S3 server, in a JVM of its own:
 *
 * <ol>
 *   <li>run 1 is SIGKILLed once at least two checkpoints with input offsets are written (read
 *       from the job's event log, never a fixed sleep);
 *   <li>the job's local state dir is deleted (a new host);
 *   <li>run 2 restores the store from S3 (Samza's BlobStoreRestoreManager through
 *       S3BlobStoreManager), resumes after the committed offset and runs to the end of the input.
 * </ol>
 *
 * The final counts must EQUAL an independent count of the input: the restored store holds
 * exactly the state of the last checkpoint (Samza flushes and snapshots the store on the run
 * loop, with processing stopped, at the offsets it checkpoints; RocksDB's WAL is off, and the
 * local state is gone anyway), and the input resumes right after that checkpoint's offset. The
 * bucket must hold blobsnap's layout for the job: the owner record naming Samza's engine, and
 * only content-addressed blobs and indexes under the store's scope.
 */
class SamzaJobTest {
  static final int LINES = 1500;
  /** Run 1's pause after each line: 4.5 s of input, killed well before its end. */
  static final long RUN1_DELAY_MS = 3;
  /** The offset the last checkpoint before the kill must have reached. */
  static final long KILL_AFTER_OFFSET = 100;
  /** Every wait for a child is bounded by this. */
  static final int WAIT_SECONDS = 60;
  static final String PREFIX = "job/";
  static final String JOB_SCOPE = PREFIX + "word%2Ecount/1/";
  static final String SCOPE = JOB_SCOPE + "tasks/Partition%200/stores/counts/";
  static final String FACTORY = WordCountJob.BLOB_STORE_FACTORY;
  static final Pattern MARKER = Pattern.compile("index/([0-9]+-[0-9]+)\\.([0-9a-f]{64})\\.json");
  /** A checkpoint write with an input offset: {@code checkpoint.write <id> offsets=[<n>] markers=...}. */
  static final Pattern WRITTEN = Pattern.compile("^checkpoint\\.write (\\S+) offsets=\\[(\\d+)\\] markers=(.*)$");
  /** The job's JVM: no --add-opens; every refused reflective access is printed (and fails the test). */
  static final List<String> JVM_FLAGS =
      Collections.unmodifiableList(Arrays.asList("-Xmx256m", "-Dsun.reflect.debugModuleAccessChecks=access"));

  private final List<Process> children = new ArrayList<>();

  /** Kills every child still running (a failed or timed-out test). */
  @AfterEach
  void killChildren() throws InterruptedException {
    for (Process p : children) {
      if (p.isAlive()) {
        p.destroyForcibly();
        p.waitFor(10, TimeUnit.SECONDS);
      }
    }
  }

  @Test
  void killedJobRestoresFromS3OnANewHost() throws Exception {
    long t0 = System.nanoTime();
    Path work = freshDir("killed-job");
    Path input = work.resolve("input.txt");
    writeInput(input);
    Map<String, Integer> expected = countWords(input);
    Path state = work.resolve("state");

    try (S3Client raw = S3Test.rawClient()) {
      String bucket = S3Test.newBucket(raw, "job");
      Map<String, String> s3 = new HashMap<>();
      s3.put(S3Settings.BUCKET, bucket);
      s3.put(S3Settings.PREFIX, PREFIX);
      s3.put(S3Settings.ENDPOINT, S3Test.endpoint().toString());
      s3.put(S3Settings.REGION, S3Test.region());
      s3.put(S3Settings.PATH_STYLE, "true");
      s3.put(S3Settings.MAX_TRANSFERS, "4");

      // ---- run 1: 3 ms a line; SIGKILLed at its 4th cleanUp, right after Samza's checkpoint
      // write, before that checkpoint is committed into blobsnap's history ----
      Process p1 = start(work, WordCountJob.config(work.toFile(), input.toFile(), RUN1_DELAY_MS, false, s3), "run1",
          Collections.singletonMap("BLOBSNAP_CRASH_AT", "samza.before-cleanup@4"));
      assertTrue(p1.waitFor(WAIT_SECONDS, TimeUnit.SECONDS), () -> "run 1 did not reach its crash point\n"
          + diagnostics(work, "run1"));
      long killedAt = System.nanoTime();
      assertEquals(137, p1.exitValue(), () -> "run 1 must die by SIGKILL\n" + diagnostics(work, "run1"));
      long checkpointsBeforeKill = written(work).size();
      List<String> run1 = events(work);
      long writesBeforeKill = run1.stream().filter(e -> e.startsWith("checkpoint.write ")).count();

      // The last checkpoint (the file, not the log: the kill may fall between its rename and the log line).
      CheckpointV2 cp = readCheckpoint(work);
      String cpId = cp.getCheckpointId().serialize();
      long k = Long.parseLong(cp.getOffsets().get(new SystemStreamPartition("lines", "input", new Partition(0))));
      assertTrue(k >= KILL_AFTER_OFFSET && k < LINES - 1,
          () -> "run 1 must be killed half way, its last checkpoint is at offset " + k + "\n" + diagnostics(work, "run1"));
      // Samza's engine keeps the store's marker under its own factory name; the marker is blobsnap's.
      assertEquals(Collections.singleton(FACTORY), cp.getStateCheckpointMarkers().keySet(), cp.toString());
      Map<String, String> scms = cp.getStateCheckpointMarkers().get(FACTORY);
      assertEquals(Collections.singleton(WordCountJob.STORE), scms.keySet(), cp.toString());
      String marker = scms.get(WordCountJob.STORE);
      Matcher mm = MARKER.matcher(marker);
      assertTrue(mm.matches(), marker);
      assertEquals(cpId, mm.group(1), "the marker names the checkpoint's id: " + marker);

      // ---- the bucket after run 1: blobsnap's layout for the job ----
      List<String> keys = keys(raw, bucket);
      String owner = JOB_SCOPE + Layout.OWNER_RECORD;
      assertTrue(keys.contains(owner), "the owner record: " + keys);
      JsonNode scope = new ObjectMapper().readTree(S3Test.getRaw(raw, bucket, owner));
      assertEquals(S3BlobStoreManager.ENGINE, scope.path("engine").asText(), scope.toString());
      assertEquals(WordCountJob.JOB_NAME, scope.path("job-name").asText(), scope.toString());
      assertEquals(WordCountJob.JOB_ID, scope.path("job-id").asText(), scope.toString());
      Layout.ParsedId[] counted = checkLayout(keys, owner);
      long indexes = Arrays.stream(counted).filter(p -> p.index).count();
      assertTrue(indexes >= writesBeforeKill,
          "an index per checkpoint written at least: " + indexes + " < " + writesBeforeKill + ": " + keys);
      assertTrue(keys.contains(SCOPE + marker), "the checkpoint's index " + marker + ": " + keys);
      byte[] index = S3Test.getRaw(raw, bucket, SCOPE + marker);
      assertEquals(mm.group(2), sha(index), "the marker names the SHA-256 of the index's bytes");
      JsonNode meta = new ObjectMapper().readTree(index).path("snapshot-metadata");
      assertEquals(cpId, meta.path("checkpoint-id").asText(), meta.toString());
      assertEquals(WordCountJob.JOB_NAME, meta.path("job-name").asText(), meta.toString());
      assertEquals("Partition 0", meta.path("task-name").asText(), meta.toString());
      assertEquals(WordCountJob.STORE, meta.path("store-name").asText(), meta.toString());
      Map<String, String> files = new TreeMap<>();
      SamzaEngineTest.blobIds(new ObjectMapper().readTree(index).path("dir-index"), "", files);
      assertTrue(files.keySet().stream().anyMatch(f -> f.endsWith(".sst")), "RocksDB's SST files: " + files);
      assertTrue(files.containsKey("CURRENT") && files.keySet().stream().anyMatch(f -> f.startsWith("MANIFEST-")),
          "RocksDB's CURRENT and MANIFEST: " + files);
      for (Map.Entry<String, String> f : files.entrySet()) {
        assertTrue(keys.contains(SCOPE + f.getValue()), f + " is in the bucket");
        assertEquals(Layout.parseId(f.getValue()).sha256, sha(S3Test.getRaw(raw, bucket, SCOPE + f.getValue())),
            "blob " + f + " holds the bytes its key names");
      }

      // ---- blobsnap's history: the killed checkpoint is prepared only; a sweep past the grace
      // keeps it (its prepared record is a root) and deletes nothing a checkpoint names ----
      String cps = BlobsnapReadsSamzaTest.blobsnapOn(work, bucket, PREFIX, "checkpoints", "--job",
          WordCountJob.JOB_NAME, "--job-id", WordCountJob.JOB_ID, "--json").stdout;
      assertFalse(cps.contains(cpId), "checkpoint " + cpId + " was committed into blobsnap's history before its"
          + " cleanUp, so the kill proves nothing: " + cps);
      assertTrue(keys.stream().anyMatch(key -> key.startsWith(JOB_SCOPE + "prepared/Partition%200/" + cpId + ".")),
          "the killed checkpoint's prepared record: " + keys);
      S3Test.serverClockPast(raw, bucket, SCOPE + marker);
      BlobsnapReadsSamzaTest.Run gc = BlobsnapReadsSamzaTest.blobsnapOn(work, bucket, PREFIX, "gc", "--job",
          WordCountJob.JOB_NAME, "--job-id", WordCountJob.JOB_ID, "--grace-secs", "0", "--force");
      assertEquals(0, gc.exit, gc.toString());
      List<String> swept = keys(raw, bucket);
      assertTrue(swept.contains(SCOPE + marker), "the sweep kept the killed checkpoint's index: " + gc);
      for (String f : files.values()) {
        assertTrue(swept.contains(SCOPE + f), "the sweep kept " + f + ": " + gc);
      }

      // ---- a new host: the job's local state is gone ----
      deleteTree(state);
      assertFalse(Files.exists(state));

      // ---- run 2: restores from S3, resumes after offset k, runs to the end of the input ----
      long run2Start = System.nanoTime();
      Process p2 = start(work, WordCountJob.config(work.toFile(), input.toFile(), 0, true, s3), "run2");
      if (!p2.waitFor(WAIT_SECONDS, TimeUnit.SECONDS)) {
        p2.destroyForcibly();
        fail("run 2 did not finish within " + WAIT_SECONDS + " s\n" + diagnostics(work, "run2"));
      }
      long run2End = System.nanoTime();
      assertEquals(0, p2.exitValue(), () -> "run 2 failed\n" + diagnostics(work, "run2"));
      List<String> run2 = events(work).subList(run1.size(), events(work).size());
      assertTrue(run2.stream().anyMatch(e -> e.startsWith("checkpoint.read " + cpId + " ")),
          () -> "run 2 starts from run 1's last checkpoint " + cpId + ": " + run2);
      assertTrue(run2.contains("register lines.input " + (k + 1)),
          () -> "run 2 resumes right after the checkpointed offset " + k + ": " + run2);
      // The store Samza restored from S3 holds exactly the checkpoint's state: k + 1 lines.
      assertTrue(run2.contains("task.init Partition 0 lines-in-store=" + (k + 1)),
          () -> "run 2's store, restored from S3 onto an empty state dir, holds the " + (k + 1)
              + " lines of the checkpoint at offset " + k + ": " + run2 + "\n" + diagnostics(work, "run2"));
      assertTrue(run2.contains("task.endOfStream lines-in-store=" + LINES), () -> run2.toString());
      assertTrue(Files.isDirectory(state.resolve("logged").resolve(WordCountJob.STORE).resolve("Partition_0")),
          "the store was restored into the logged store dir");

      // Exactly once in state: the final counts are the input's.
      Map<String, Integer> got = readCounts(work.resolve(WordCountTask.COUNTS_FILE));
      assertEquals(expected, got, "the final word counts equal an independent count of the input");

      for (String run : Arrays.asList("run1", "run2")) {
        String text = new String(Files.readAllBytes(log(work, run)), StandardCharsets.UTF_8);
        assertFalse(text.contains("InaccessibleObjectException") || text.contains("Unable to make")
            || text.contains("IllegalAccess"), run + ".log shows a refused reflective access\n" + diagnostics(work, run));
      }

      // ---- the bucket after run 2: still only blobsnap's layout ----
      List<String> after = keys(raw, bucket);
      Layout.ParsedId[] all = checkLayout(after, owner);
      long indexesAfter = Arrays.stream(all).filter(p -> p.index).count();
      long blobsAfter = all.length - indexesAfter;
      // (Not asserted: that run 2 committed. Its commit at start is still in flight when the
      // input ends, so the end-of-stream commit is skipped ("another commit is in progress"), and
      // the shutdown closes the commit pool under the one in flight: its blobs are up, but its
      // index and checkpoint write are there in some runs only, and its cleanUp never completes.)

      // Evidence: the config the job ran with, its last CheckpointV2, the bucket's listing.
      Path ev = S3Test.evidenceDir();
      Files.createDirectories(ev);
      Files.copy(work.resolve("run2.properties"), ev.resolve("job-config.properties"),
          java.nio.file.StandardCopyOption.REPLACE_EXISTING);
      Files.write(ev.resolve("job-checkpoint-v2-before-kill.json"), new CheckpointV2Serde().toBytes(cp));
      List<String> listing = new ArrayList<>();
      listing.add("# s3://" + bucket + "/" + PREFIX + " after a real Samza 1.8.0 job (killed, restored on a new host)"
          + " through blobsnap.samza.S3BlobStoreManager (key<TAB>size)");
      for (S3Object o : S3Test.list(raw, bucket, PREFIX)) {
        listing.add(o.key() + "\t" + o.size());
      }
      Files.write(ev.resolve("job-bucket-listing.txt"), listing, StandardCharsets.UTF_8);

      System.out.printf("samza job on S3: run 1 killed after %d checkpoints (%d with input offsets; %.1f s after"
              + " the test's start), the last at offset %d (checkpoint %s, %d files in its index); run 2 restored"
              + " %d lines from S3 and finished in %.1f s; counts exact (%d words, %d lines); bucket: %d indexes,"
              + " %d blobs; test %.1f s%n",
          writesBeforeKill, checkpointsBeforeKill, (killedAt - t0) / 1e9, k, cpId, files.size(), k + 1,
          (run2End - run2Start) / 1e9,
          expected.size() - 1, LINES, indexesAfter, blobsAfter, (System.nanoTime() - t0) / 1e9);
    }
  }

  // ----- the layout -----

  /** Every key of the job's prefix: the owner record, or a blob or an index under the store's scope. */
  static Layout.ParsedId[] checkLayout(List<String> keys, String owner) {
    List<Layout.ParsedId> out = new ArrayList<>();
    for (String k : keys) {
      if (k.equals(owner) || S3Test.isHistoryRecord(JOB_SCOPE, k)) {
        continue;
      }
      assertTrue(k.startsWith(SCOPE), "outside the store's scope " + SCOPE + ": " + k);
      Layout.ParsedId id = Layout.parseId(k.substring(SCOPE.length()));
      assertEquals(id.index, k.substring(SCOPE.length()).startsWith("index/"), k);
      out.add(id);
    }
    assertTrue(out.stream().anyMatch(p -> p.index) && out.stream().anyMatch(p -> !p.index),
        "blobs and indexes in the bucket: " + keys);
    return out.toArray(new Layout.ParsedId[0]);
  }

  static List<String> keys(S3Client raw, String bucket) {
    return S3Test.list(raw, bucket, PREFIX).stream().map(S3Object::key).collect(Collectors.toList());
  }

  static String sha(byte[] bytes) {
    return S3BlobStoreManager.hex(S3BlobStoreManager.sha256().digest(bytes));
  }

  // ----- the child JVM -----

  interface Check {
    boolean ok() throws Exception;
  }

  static String property(String name) {
    String v = System.getProperty(name);
    if (v == null || v.isEmpty()) {
      fail("system property " + name + " is not set (run the test through Maven: the pom sets it)");
    }
    return v;
  }

  static Path log(Path work, String run) {
    return work.resolve(run + ".log");
  }

  /** Starts the job in a JVM of its own, with its config in {@code <run>.properties} and its output in {@code <run>.log}. */
  Process start(Path work, Map<String, String> config, String run) throws IOException {
    return start(work, config, run, Collections.<String, String>emptyMap());
  }

  /** As above, with {@code env} set in the job's environment (e.g. a crash point). */
  Process start(Path work, Map<String, String> config, String run, Map<String, String> env) throws IOException {
    Path props = work.resolve(run + ".properties");
    WordCountJob.write(config, props);
    String cp = property("blobsnap.samza.s3.job.classpath") + File.pathSeparator
        + new String(Files.readAllBytes(Paths.get(property("blobsnap.samza.s3.job.classpath.file"))),
            StandardCharsets.UTF_8).trim();
    List<String> cmd = new ArrayList<>();
    cmd.add(Paths.get(System.getProperty("java.home"), "bin", "java").toString());
    cmd.addAll(JVM_FLAGS);
    // The S3 server's credentials, as the SDK's default chain reads them (system properties
    // first); never the machine's (no instance metadata; the pom's AWS_PROFILE/AWS_CONFIG_FILE
    // are inherited).
    cmd.add("-Daws.accessKeyId=" + S3Test.env("BLOBSNAP_TEST_S3_ACCESS_KEY", "test"));
    cmd.add("-Daws.secretAccessKey=" + S3Test.env("BLOBSNAP_TEST_S3_SECRET_KEY", "test"));
    cmd.add("-Daws.region=" + S3Test.region());
    cmd.add("-Daws.disableEc2Metadata=true");
    cmd.add("-Dorg.slf4j.simpleLogger.defaultLogLevel=info");
    cmd.add("-Dorg.slf4j.simpleLogger.showDateTime=true");
    cmd.addAll(Arrays.asList("-cp", cp, WordCountJob.class.getName(), props.toString()));
    ProcessBuilder pb = new ProcessBuilder(cmd).directory(work.toFile()).redirectErrorStream(true)
        .redirectOutput(log(work, run).toFile()).redirectInput(ProcessBuilder.Redirect.from(new File("/dev/null")));
    pb.environment().keySet().removeIf(k -> k.startsWith("AWS_") && !k.equals("AWS_PROFILE")
        && !k.equals("AWS_CONFIG_FILE") && !k.equals("AWS_SHARED_CREDENTIALS_FILE"));
    pb.environment().put("AWS_EC2_METADATA_DISABLED", "true");
    pb.environment().putAll(env);
    Process p = pb.start();
    children.add(p);
    return p;
  }

  static void waitUntil(String what, Check check, Process p, Path work, String run) throws Exception {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(WAIT_SECONDS);
    while (!check.ok()) {
      if (!p.isAlive()) {
        fail(run + " exited with " + p.exitValue() + " before " + what + "\n" + diagnostics(work, run));
      }
      if (System.nanoTime() > deadline) {
        p.destroyForcibly();
        fail("timed out after " + WAIT_SECONDS + " s waiting for " + what + "\n" + diagnostics(work, run));
      }
      Thread.sleep(20);
    }
  }

  /** The job's events and the end of its output, for a failure message. */
  static String diagnostics(Path work, String run) {
    StringBuilder b = new StringBuilder();
    try {
      b.append("---- events.txt ----\n");
      for (String e : events(work)) {
        b.append(e).append('\n');
      }
      Path log = log(work, run);
      List<String> lines = Files.exists(log) ? Files.readAllLines(log, StandardCharsets.UTF_8)
          : Collections.<String>emptyList();
      int from = Math.max(0, lines.size() - 150);
      b.append("---- ").append(log).append(" (").append(lines.size() - from).append(" last of ").append(lines.size())
          .append(" lines) ----\n");
      for (String l : lines.subList(from, lines.size())) {
        b.append(l).append('\n');
      }
    } catch (IOException | RuntimeException e) {
      b.append("(cannot read the job's output: ").append(e).append(")\n");
    }
    return b.toString();
  }

  static List<String> events(Path work) throws IOException {
    Path f = work.resolve(Events.FILE);
    return Files.exists(f) ? Files.readAllLines(f, StandardCharsets.UTF_8) : Collections.<String>emptyList();
  }

  /** The offsets of the checkpoints written with an input offset, by the job's event log. */
  static List<Long> written(Path work) throws IOException {
    List<Long> out = new ArrayList<>();
    for (String e : events(work)) {
      Matcher m = WRITTEN.matcher(e);
      if (m.matches()) {
        assertTrue(m.group(3).contains(FACTORY), "a checkpoint without the blob store's marker: " + e);
        out.add(Long.parseLong(m.group(2)));
      }
    }
    return out;
  }

  static CheckpointV2 readCheckpoint(Path work) throws IOException {
    File f = FileCheckpointManagerFactory.file(work.resolve("checkpoints").toFile(), new TaskName("Partition 0"));
    return new CheckpointV2Serde().fromBytes(Files.readAllBytes(f.toPath()));
  }

  // ----- input and counts -----

  static Path freshDir(String name) throws IOException {
    Path dir = Paths.get(property("blobsnap.samza.s3.job.work"), name).toAbsolutePath();
    deleteTree(dir);
    Files.createDirectories(dir);
    return dir;
  }

  static void deleteTree(Path dir) throws IOException {
    if (Files.exists(dir)) {
      try (Stream<Path> s = Files.walk(dir)) {
        for (Path p : s.sorted(Collections.reverseOrder()).collect(Collectors.toList())) {
          Files.delete(p);
        }
      }
    }
  }

  /** Lines of words from a small vocabulary (and one word per line from a larger one). */
  static void writeInput(Path input) throws IOException {
    try (Writer w = Files.newBufferedWriter(input, StandardCharsets.UTF_8)) {
      for (int i = 0; i < LINES; i++) {
        w.write("w" + (i % 7) + " x" + (i % 13) + " w" + (i % 3) + " k" + (i * 7919 % 211) + "\n");
      }
    }
  }

  /** The independent count: the file read back, split on blanks; lines under the task's key. */
  static Map<String, Integer> countWords(Path input) throws IOException {
    Map<String, Integer> counts = new TreeMap<>();
    List<String> lines = Files.readAllLines(input, StandardCharsets.UTF_8);
    for (String line : lines) {
      for (String word : line.trim().split("\\s+")) {
        if (!word.isEmpty()) {
          counts.merge(word, 1, Integer::sum);
        }
      }
    }
    counts.put(WordCountTask.LINES, lines.size());
    assertEquals(LINES, lines.size());
    return counts;
  }

  static Map<String, Integer> readCounts(Path f) throws IOException {
    Map<String, Integer> m = new TreeMap<>();
    for (String line : Files.readAllLines(f, StandardCharsets.UTF_8)) {
      String[] kv = line.split(" ");
      m.put(kv[0], Integer.parseInt(kv[1]));
    }
    return m;
  }
}
