package blobsnap.spike;

import blobsnap.samza.job.FileCheckpointManagerFactory;
import blobsnap.samza.job.WordCountTask;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.io.File;
import java.io.IOException;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * Route 1 end to end: a REAL Samza 1.8.0 job ({@link SpikeJob}: LocalApplicationRunner, the
 * passthrough coordinator, one task, a RocksDB store, a durable line file) whose store is backed
 * up by blobsnap's engine through JNI ({@code blobsnap.BlobStoreStateBackendFactory}) and whose
 * CheckpointV2s are blobsnap's ({@code blobsnap.BlobsnapCheckpointManagerFactory}), on the
 * suite's S3 server (BLOBSNAP_TEST_S3_*; without one the test FAILS).
 *
 * <p>Its JVM is SIGKILLed three times, each at a random point (a seeded delay of 0-400 ms) after a
 * checkpoint past the last one is written (read from the job's event log); before runs 2 and 4 its local state is deleted (a new
 * host), run 3 restarts on the same host. Each restart must restore exactly the store of the
 * checkpoint it resumes from ({@code lines-in-store} = offset + 1) and resume right after its
 * offset. Between the runs an operator works on the job with blobsnap's binary: a savepoint after
 * run 1, {@code unlock} and {@code gc} after run 3; run 4 starts from that savepoint (a
 * rollback, {@code blobsnap.job.start-from}) and the final counts must still EQUAL an independent
 * count of the input. Run 5 is a fork (job id 2) of the same savepoint on a new host, run to the
 * end with the same exact counts. blobsnap then lists the job's checkpoints with their offsets
 * and reads every retained blob back.
 */
class JniJobTest {
  static final int LINES = 3000;
  static final String JOB = "spike";
  static final String FACTORY = "blobsnap.BlobStoreStateBackendFactory";
  static final int WAIT_SECONDS = 120;
  static final Pattern WRITTEN = Pattern.compile("^checkpoint\\.write (\\S+) offsets=\\[(\\d+)\\] markers=(.*)$");

  private final List<Process> children = new ArrayList<>();

  @AfterEach
  void killChildren() throws InterruptedException {
    for (Process p : children) {
      if (p.isAlive()) {
        p.destroyForcibly();
        p.waitFor(10, TimeUnit.SECONDS);
      }
    }
  }

  static String env(String name, String dflt) {
    String v = System.getenv(name);
    return v == null || v.isEmpty() ? dflt : v;
  }

  static URI endpoint() {
    String ep = env("BLOBSNAP_TEST_S3_ENDPOINT", null);
    if (ep == null) {
      fail("BLOBSNAP_TEST_S3_ENDPOINT is not set: this test needs an S3 server on loopback (scripts/test.sh"
          + " starts LocalStack and sets it)");
    }
    URI uri = URI.create(ep);
    if (!"127.0.0.1".equals(uri.getHost()) && !"localhost".equals(uri.getHost())) {
      fail("BLOBSNAP_TEST_S3_ENDPOINT=" + ep + ": the tests only talk to loopback servers");
    }
    return uri;
  }

  static String property(String name) {
    String v = System.getProperty(name);
    if (v == null || v.trim().isEmpty() || v.startsWith("${")) {
      fail("system property " + name + " is not set (run through Maven: scripts/samza.sh sets it)");
    }
    return v.trim();
  }

  static Path nativeLib() {
    Path lib = Paths.get(property("blobsnap.native.lib"));
    if (!Files.isRegularFile(lib)) {
      fail("blobsnap.native.lib=" + lib + ": no such file (cargo build -p blobsnap-samza-jni; scripts/samza.sh does)");
    }
    return lib;
  }

  @Test
  void killedThreeTimesTheJobResumesFromBlobsnapsCheckpointsWithExactCounts() throws Exception {
    long t0 = System.nanoTime();
    Path work = SamzaJobTest.freshDir("jni-job");
    Path input = work.resolve("input.txt");
    Map<String, Integer> expected = SamzaJobTest.writeInput(input, LINES);
    String bucket = ("blobsnap-jni-" + UUID.randomUUID().toString().substring(0, 8)).toLowerCase(Locale.ROOT);
    List<String> overrides = new ArrayList<>(Arrays.asList(
        "stores.counts.backup.factories=" + FACTORY,
        "stores.counts.restore.factories=" + FACTORY,
        "task.checkpoint.factory=" + LoggingBlobsnapCheckpoints.class.getName(),
        FileCheckpointManagerFactory.DIR + "=",
        "blobsnap.store.kind=s3",
        "blobsnap.s3.bucket=" + bucket,
        "blobsnap.s3.endpoint=" + endpoint(),
        "blobsnap.s3.region=" + env("BLOBSNAP_TEST_S3_REGION", "us-east-1"),
        "blobsnap.s3.path-style=true",
        "blobsnap.store.max-transfers=4",
        "blobsnap.job.retention=2",
        "blobsnap.job.gc-grace-secs=600"));

    long lastOffset = -1;
    long savepointOffset = -1;
    List<String> report = new ArrayList<>();
    // Each kill falls at a random point of the commit cycle: a seeded delay after the awaited
    // checkpoint (BLOBSNAP_TEST_SEED repeats a run).
    long seed = Long.parseLong(env("BLOBSNAP_TEST_SEED", Long.toString(System.nanoTime() % 1_000_000)));
    java.util.Random random = new java.util.Random(seed);
    report.add("seed " + seed);
    for (int run = 1; run <= 3; run++) {
      if (run != 3) {
        deleteState(work); // a new host: the store comes from the bucket
      }
      int before = SamzaJobTest.events(work).size();
      Process p = start(work, input, 2, false, "run" + run, overrides);
      final long after = lastOffset;
      final int from = before;
      SamzaJobTest.waitFor(() -> {
        List<Long> w = written(work, from);
        return w.size() >= 2 && w.get(w.size() - 1) > after + 150;
      }, p, work.resolve("run" + run + ".log"), WAIT_SECONDS);
      long delayMs = random.nextInt(400);
      Thread.sleep(delayMs);
      p.destroyForcibly(); // SIGKILL on Linux
      assertTrue(p.waitFor(30, TimeUnit.SECONDS), "run " + run + " did not die");
      assertEquals(137, p.exitValue(), "run " + run + " must die by SIGKILL");
      List<String> ev = SamzaJobTest.events(work).subList(before, SamzaJobTest.events(work).size());
      long resumed = checkResumed(ev, lastOffset, run, work);
      if (run == 2) {
        savepointOffset = resumed; // the savepoint made after run 1 names the checkpoint run 2 resumed from
      }
      List<Long> w = written(work, before);
      lastOffset = w.get(w.size() - 1);
      // The kill may fall after a later write than the log's last line: the next run reads
      // which one it resumes from, and checks it against the log.
      report.add("run " + run + " killed " + delayMs + " ms after the checkpoint at offset " + lastOffset);
      if (run == 1) {
        // An operator's savepoint of the stopped job: the rollback target of run 4.
        blobsnap(work, bucket, "savepoint", "create", "--job", JOB, "--job-id", "1", "--name", "after-run1");
      }
      List<Long> all = written(work, 0);
      if (!(lastOffset < LINES - 1)) {
        fail("run " + run + " reached the end of the input before its kill: make the input longer (" + all + ")");
      }
    }

    // The operator's second hour on a Samza job: the killed JVM's writer lease released (its
    // process is gone), a sweep of the job's orphans (the grace of its scope), nothing a
    // retained checkpoint or the savepoint names deleted (run 4 restores, check reads all).
    String unlock = blobsnap(work, bucket, "unlock", "--job", JOB, "--job-id", "1");
    String gc = blobsnap(work, bucket, "gc", "--job", JOB, "--job-id", "1");

    // Run 4 on a new host, rolled back to the savepoint: restores its checkpoint, resumes
    // after its offset and runs to the end of the input; the counts are still exact.
    deleteState(work);
    int before = SamzaJobTest.events(work).size();
    List<String> rollback = new ArrayList<>(overrides);
    rollback.add("blobsnap.job.start-from=savepoint:after-run1");
    Process p4 = start(work, input, 0, true, "run4", rollback);
    if (!p4.waitFor(WAIT_SECONDS, TimeUnit.SECONDS)) {
      p4.destroyForcibly();
      fail("run 4 did not finish within " + WAIT_SECONDS + " s: see " + work.resolve("run4.log"));
    }
    assertEquals(0, p4.exitValue(), () -> "run 4 failed: see " + work.resolve("run4.log") + "\n" + tail(work, "run4"));
    List<String> ev4 = SamzaJobTest.events(work).subList(before, SamzaJobTest.events(work).size());
    long resumed4 = checkResumed(ev4, savepointOffset, 4, work);
    assertEquals(savepointOffset, resumed4, "run 4 starts from the savepoint's checkpoint (a rollback): " + ev4);
    assertTrue(savepointOffset < lastOffset, "the savepoint is older than the last checkpoint");
    assertTrue(ev4.contains("task.endOfStream lines-in-store=" + LINES), ev4.toString());
    Map<String, Integer> got = SamzaJobTest.readCounts(work.resolve(WordCountTask.COUNTS_FILE));
    assertEquals(expected, got, "the final word counts equal an independent count of the input");

    // Run 5: a fork (job id 2) of the savepoint, on a new host: it starts from the savepoint's
    // checkpoint in its own scope, borrowing the source's blobs, and runs to the end: the counts
    // are exact again; the source's history is untouched.
    deleteState(work);
    int before5 = SamzaJobTest.events(work).size();
    List<String> fork = new ArrayList<>(overrides);
    fork.addAll(Arrays.asList("job.id=2", "app.id=2", "blobsnap.job.start-from=savepoint:" + JOB + "/1/after-run1"));
    Process p5 = start(work, input, 0, true, "run5", fork);
    if (!p5.waitFor(WAIT_SECONDS, TimeUnit.SECONDS)) {
      p5.destroyForcibly();
      fail("run 5 (the fork) did not finish within " + WAIT_SECONDS + " s: see " + work.resolve("run5.log"));
    }
    assertEquals(0, p5.exitValue(), () -> "run 5 failed\n" + tail(work, "run5"));
    List<String> ev5 = SamzaJobTest.events(work).subList(before5, SamzaJobTest.events(work).size());
    assertEquals(savepointOffset, checkResumed(ev5, savepointOffset, 5, work),
        "the fork starts from the savepoint's checkpoint: " + ev5);
    assertTrue(ev5.contains("task.endOfStream lines-in-store=" + LINES), ev5.toString());
    assertEquals(expected, SamzaJobTest.readCounts(work.resolve(WordCountTask.COUNTS_FILE)),
        "the fork's final word counts equal an independent count of the input");
    String forkCps = blobsnap(work, bucket, "checkpoints", "--job", JOB, "--job-id", "2", "--json");
    assertTrue(forkCps.contains("lines.input.0"), "the fork's own history: " + forkCps);

    for (int run = 1; run <= 5; run++) {
      String text = new String(Files.readAllBytes(work.resolve("run" + run + ".log")), StandardCharsets.UTF_8);
      assertFalse(text.contains("InaccessibleObjectException") || text.contains("Unable to make")
          || text.contains("IllegalAccess"), "run" + run + ".log shows a refused reflective access");
      assertFalse(text.contains("panic"), "run" + run + ".log shows a panic of the native library");
    }

    // blobsnap's own binary reads the Samza job's history: its checkpoints with their input
    // offsets and markers, and every retained blob, read back and verified.
    String cps = blobsnap(work, bucket, "checkpoints", "--job", JOB, "--job-id", "1", "--json");
    assertTrue(cps.contains("lines.input.0"), "the Samza job's input offsets are in blobsnap's history: " + cps);
    assertTrue(cps.contains("\"marker\":\"index/"), "its store's marker, an index of blobsnap's layout: " + cps);
    String check = blobsnap(work, bucket, "check", "--job", JOB, "--job-id", "1", "--read-data");
    System.out.printf("jni job: %s; unlock: %s; gc: %s; run 4 rolled back to savepoint after-run1 (offset %d),"
            + " restored %d lines and finished; run 5, a fork of the savepoint, finished with the same counts;"
        + " counts exact (%d words); %.1f s%n%s%n",
        report, unlock.trim(), gc.trim(), savepointOffset, savepointOffset + 1, expected.size() - 1,
        (System.nanoTime() - t0) / 1e9, check);
  }

  /**
   * A restarted run must start from the checkpoint it read, with the store restored exactly to
   * it, and resume right after its offset.
   */
  static long checkResumed(List<String> ev, long lastLogged, int run, Path work) {
    if (run == 1) {
      assertTrue(ev.contains("checkpoint.read none"), "run 1 starts with no checkpoint: " + ev);
      return -1;
    }
    String read = ev.stream().filter(e -> e.startsWith("checkpoint.read ")).findFirst()
        .orElseThrow(() -> new AssertionError("run " + run + " read no checkpoint: " + ev));
    Matcher m = Pattern.compile("^checkpoint\\.read \\S+ offsets=\\[(\\d+)\\]$").matcher(read);
    assertTrue(m.matches(), "run " + run + " resumes from a checkpoint with an offset: " + read);
    long k = Long.parseLong(m.group(1));
    assertTrue(k >= lastLogged, "run " + run + " resumes from offset " + k + ", before the last logged write "
        + lastLogged + ": " + ev);
    assertTrue(ev.contains("register lines.input " + (k + 1)), "run " + run + " resumes after offset " + k + ": " + ev);
    assertTrue(ev.contains("task.init Partition 0 lines-in-store=" + (k + 1)),
        "run " + run + "'s store holds exactly the " + (k + 1) + " lines of its checkpoint: " + ev + "\n"
            + tail(work, "run" + run));
    return k;
  }

  static List<Long> written(Path work, int from) throws IOException {
    List<Long> out = new ArrayList<>();
    List<String> ev = SamzaJobTest.events(work);
    for (String e : ev.subList(from, ev.size())) {
      Matcher m = WRITTEN.matcher(e);
      if (m.matches()) {
        assertTrue(m.group(3).contains(FACTORY), "a checkpoint without blobsnap's marker: " + e);
        out.add(Long.parseLong(m.group(2)));
      }
    }
    return out;
  }

  static void deleteState(Path work) throws IOException {
    for (String d : Arrays.asList("stores-logged", "stores")) {
      Path dir = work.resolve(d);
      if (Files.exists(dir)) {
        try (java.util.stream.Stream<Path> s = Files.walk(dir)) {
          s.sorted(Collections.reverseOrder()).map(Path::toFile).forEach(File::delete);
        }
      }
      assertFalse(Files.exists(dir), dir + " deleted");
    }
  }

  static String tail(Path work, String run) {
    try {
      List<String> lines = Files.readAllLines(work.resolve(run + ".log"), StandardCharsets.UTF_8);
      return String.join("\n", lines.subList(Math.max(0, lines.size() - 80), lines.size()));
    } catch (IOException e) {
      return "(no log: " + e + ")";
    }
  }

  /** The job in a JVM of its own, the S3 server's credentials in the AWS variables, nothing of the machine's. */
  Process start(Path work, Path input, long delayMs, boolean endOfStream, String run, List<String> overrides)
      throws IOException {
    return start(work, input, delayMs, endOfStream, run, overrides, Collections.<String, String>emptyMap());
  }

  /** As above, with {@code extraEnv} set in the job's environment (e.g. a crash point). */
  Process start(Path work, Path input, long delayMs, boolean endOfStream, String run, List<String> overrides,
      Map<String, String> extraEnv) throws IOException {
    String cp = property("blobsnap.spike.classpath") + File.pathSeparator
        + new String(Files.readAllBytes(Paths.get(property("blobsnap.spike.classpath.file"))),
            StandardCharsets.UTF_8).trim();
    List<String> cmd = new ArrayList<>();
    cmd.add(Paths.get(System.getProperty("java.home"), "bin", "java").toString());
    cmd.addAll(SamzaJobTest.JVM_FLAGS);
    cmd.add("-Dblobsnap.native.lib=" + nativeLib());
    for (String o : overrides) {
      cmd.add("-Dspike.config." + o);
    }
    cmd.addAll(Arrays.asList("-cp", cp, SpikeJob.class.getName(), work.toString(), input.toString(),
        Long.toString(delayMs), Boolean.toString(endOfStream)));
    ProcessBuilder pb = new ProcessBuilder(cmd).redirectErrorStream(true)
        .redirectOutput(work.resolve(run + ".log").toFile())
        .redirectInput(ProcessBuilder.Redirect.from(new File("/dev/null")));
    awsEnv(pb.environment(), work);
    pb.environment().putAll(extraEnv);
    Process p = pb.start();
    children.add(p);
    return p;
  }

  static void awsEnv(Map<String, String> env, Path work) throws IOException {
    for (Iterator<String> i = env.keySet().iterator(); i.hasNext();) {
      String k = i.next();
      if (k.startsWith("BLOBSNAP_") && !k.startsWith("BLOBSNAP_TEST_") || k.startsWith("AWS_")) {
        i.remove();
      }
    }
    env.put("AWS_ACCESS_KEY_ID", env("BLOBSNAP_TEST_S3_ACCESS_KEY", "test"));
    env.put("AWS_SECRET_ACCESS_KEY", env("BLOBSNAP_TEST_S3_SECRET_KEY", "test"));
    env.put("AWS_EC2_METADATA_DISABLED", "true");
    Path cfg = work.resolve("aws-config");
    Path creds = work.resolve("aws-credentials");
    if (!Files.exists(cfg)) {
      Files.createFile(cfg);
    }
    if (!Files.exists(creds)) {
      Files.createFile(creds);
    }
    env.put("AWS_CONFIG_FILE", cfg.toString());
    env.put("AWS_SHARED_CREDENTIALS_FILE", creds.toString());
  }

  /** {@code blobsnap SUB ARGS} against the job's bucket; fails unless it exits 0; its stdout. */
  static String blobsnap(Path work, String bucket, String sub, String... args) throws Exception {
    String bin = property("blobsnap.bin");
    if (!Files.isExecutable(Paths.get(bin))) {
      fail("blobsnap.bin=" + bin + ": not an executable (cargo build; scripts/samza.sh sets it)");
    }
    List<String> cmd = new ArrayList<>(Arrays.asList(bin, sub));
    cmd.addAll(Arrays.asList(args));
    cmd.addAll(Arrays.asList("--bucket", bucket, "--s3-endpoint", endpoint().toString(), "--s3-region",
        env("BLOBSNAP_TEST_S3_REGION", "us-east-1"), "--s3-path-style"));
    Path out = work.resolve("cli-" + sub + ".out");
    Path err = work.resolve("cli-" + sub + ".err");
    ProcessBuilder pb = new ProcessBuilder(cmd).redirectOutput(out.toFile()).redirectError(err.toFile())
        .redirectInput(ProcessBuilder.Redirect.from(new File("/dev/null")));
    awsEnv(pb.environment(), work);
    Process p = pb.start();
    if (!p.waitFor(WAIT_SECONDS, TimeUnit.SECONDS)) {
      p.destroyForcibly();
      fail("blobsnap " + sub + " did not finish within " + WAIT_SECONDS + " s");
    }
    String stdout = new String(Files.readAllBytes(out), StandardCharsets.UTF_8);
    String stderr = new String(Files.readAllBytes(err), StandardCharsets.UTF_8);
    assertEquals(0, p.exitValue(), "blobsnap " + cmd + "\n--- stdout ---\n" + stdout + "\n--- stderr ---\n" + stderr);
    return stdout;
  }
}
