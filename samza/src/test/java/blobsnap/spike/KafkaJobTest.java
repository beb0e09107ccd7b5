package blobsnap.spike;

import blobsnap.samza.job.FileCheckpointManagerFactory;
import blobsnap.samza.job.WordCountTask;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.net.URI;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * Route 1 under Samza's OWN Kafka checkpoint manager, against a real Kafka broker on loopback
 * (its own JVM, minio/kafka.sh; BLOBSNAP_TEST_KAFKA, without it the test FAILS) and the suite's
 * S3 server: the job's CheckpointV2s live in Kafka, so blobsnap's bucket holds no commit point of
 * its own. Each upload leaves a prepared history record; Samza's checkpoint is committed into
 * blobsnap's history at {@code cleanUp} or by the next start.
 *
 * <p>The JVM kills itself with SIGKILL right after Samza's third checkpoint write, before that
 * checkpoint's {@code cleanUp} (the crash point {@code samza.before-cleanup}): the snapshot Kafka
 * names is in no blobsnap checkpoint. An operator then releases the lease and sweeps past the
 * grace ({@code gc --grace-secs 0 --force}); a restart on a new host restores exactly the store of
 * Kafka's checkpoint (a sweep that deleted what the prepared record names would fail it), resumes
 * after its offset and runs to the end: the counts EQUAL an independent count of the input, and
 * blobsnap's history then holds Kafka's checkpoint with its offsets.
 */
class KafkaJobTest {
  static final int LINES = 3000;
  static final String JOB = "spike";

  private final JniJobTest jobs = new JniJobTest();

  @AfterEach
  void killChildren() throws InterruptedException {
    jobs.killChildren();
  }

  static String broker() {
    String b = JniJobTest.env("BLOBSNAP_TEST_KAFKA", null);
    if (b == null) {
      fail("BLOBSNAP_TEST_KAFKA is not set: this test needs a Kafka broker on loopback (scripts/test.sh starts one"
          + " with minio/kafka.sh and sets it)");
    }
    String host = URI.create("kafka://" + b).getHost();
    if (!"127.0.0.1".equals(host) && !"localhost".equals(host)) {
      fail("BLOBSNAP_TEST_KAFKA=" + b + ": the tests only talk to loopback servers");
    }
    return b;
  }

  @Test
  void killedBetweenKafkasCheckpointAndCleanUpTheSweepKeepsItsSnapshotAndTheRestartIsExact() throws Exception {
    long t0 = System.nanoTime();
    String broker = broker();
    Path work = SamzaJobTest.freshDir("kafka-job");
    Path input = work.resolve("input.txt");
    Map<String, Integer> expected = SamzaJobTest.writeInput(input, LINES);
    String suffix = UUID.randomUUID().toString().substring(0, 8).toLowerCase(Locale.ROOT);
    String bucket = "blobsnap-kafka-" + suffix;
    // A job id of its own: the checkpoint topic is named after the job, and the broker outlives the test.
    String jobId = "k" + suffix;
    List<String> overrides = new ArrayList<>(Arrays.asList(
        "job.id=" + jobId,
        "app.id=" + jobId,
        "stores.counts.backup.factories=" + JniJobTest.FACTORY,
        "stores.counts.restore.factories=" + JniJobTest.FACTORY,
        "task.checkpoint.factory=" + LoggingKafkaCheckpoints.class.getName(),
        "task.checkpoint.system=kafka",
        "task.checkpoint.replication.factor=1",
        "systems.kafka.samza.factory=org.apache.samza.system.kafka.KafkaSystemFactory",
        "systems.kafka.consumer.bootstrap.servers=" + broker,
        "systems.kafka.producer.bootstrap.servers=" + broker,
        FileCheckpointManagerFactory.DIR + "=",
        "blobsnap.store.kind=s3",
        "blobsnap.s3.bucket=" + bucket,
        "blobsnap.s3.endpoint=" + JniJobTest.endpoint(),
        "blobsnap.s3.region=" + JniJobTest.env("BLOBSNAP_TEST_S3_REGION", "us-east-1"),
        "blobsnap.s3.path-style=true",
        "blobsnap.store.max-transfers=4",
        "blobsnap.job.retention=2",
        "blobsnap.job.gc-grace-secs=600"));

    // Run 1: killed by the crash point once Samza wrote its third checkpoint to Kafka and called
    // cleanUp, before the backup's cleanup ran.
    Process p1 = jobs.start(work, input, 2, false, "run1", overrides,
        Collections.singletonMap("BLOBSNAP_CRASH_AT", "samza.before-cleanup@3"));
    if (!p1.waitFor(JniJobTest.WAIT_SECONDS, TimeUnit.SECONDS)) {
      fail("run 1 did not reach its crash point within " + JniJobTest.WAIT_SECONDS + " s: see "
          + work.resolve("run1.log") + "\n" + JniJobTest.tail(work, "run1"));
    }
    assertEquals(137, p1.exitValue(), () -> "run 1 must die by SIGKILL at its crash point\n"
        + JniJobTest.tail(work, "run1"));
    List<String> ev1 = SamzaJobTest.events(work);
    assertTrue(ev1.contains("checkpoint.read none"), "run 1 starts with no checkpoint: " + ev1);
    List<Long> w = JniJobTest.written(work, 0);
    assertFalse(w.isEmpty(), "run 1 wrote no checkpoint with an offset: " + ev1);
    long killedAt = w.get(w.size() - 1);
    String killedId = lastWrittenId(ev1);
    assertTrue(killedAt < LINES - 1, "run 1 reached the end of its input before its kill: " + w);

    // Kafka names the checkpoint; blobsnap's history does not have it yet (its prepared record does).
    String before = JniJobTest.blobsnap(work, bucket, "checkpoints", "--job", JOB, "--job-id", jobId, "--json");
    assertFalse(before.contains(killedId), "the killed checkpoint " + killedId
        + " was promoted before cleanUp, so the kill proves nothing: " + before);

    // The operator: the dead JVM's lease released, a sweep past the grace.
    String unlock = JniJobTest.blobsnap(work, bucket, "unlock", "--job", JOB, "--job-id", jobId);
    String gc = JniJobTest.blobsnap(work, bucket, "gc", "--job", JOB, "--job-id", jobId, "--grace-secs", "0",
        "--force");

    // Run 2 on a new host: Kafka's checkpoint restored exactly, then to the end of the input.
    JniJobTest.deleteState(work);
    int from = SamzaJobTest.events(work).size();
    Process p2 = jobs.start(work, input, 0, true, "run2", overrides);
    if (!p2.waitFor(JniJobTest.WAIT_SECONDS, TimeUnit.SECONDS)) {
      p2.destroyForcibly();
      fail("run 2 did not finish within " + JniJobTest.WAIT_SECONDS + " s: see " + work.resolve("run2.log"));
    }
    assertEquals(0, p2.exitValue(), () -> "run 2 failed\n" + JniJobTest.tail(work, "run2"));
    List<String> ev2 = SamzaJobTest.events(work).subList(from, SamzaJobTest.events(work).size());
    long resumed = JniJobTest.checkResumed(ev2, killedAt, 2, work);
    assertTrue(ev2.stream().anyMatch(e -> e.startsWith("checkpoint.read " + killedId + " ")),
        "run 2 reads the checkpoint run 1 was killed after (" + killedId + "): " + ev2);
    assertTrue(ev2.contains("task.endOfStream lines-in-store=" + LINES), ev2.toString());
    Map<String, Integer> got = SamzaJobTest.readCounts(work.resolve(WordCountTask.COUNTS_FILE));
    assertEquals(expected, got, "the final word counts equal an independent count of the input");
    String log2 = JniJobTest.tail(work, "run2");
    assertFalse(log2.contains("panic"), "run2.log shows a panic of the native library");

    // blobsnap's history now has Kafka's checkpoint, with its offsets (committed by run 2's
    // start), and every retained blob reads back verified.
    String cps = JniJobTest.blobsnap(work, bucket, "checkpoints", "--job", JOB, "--job-id", jobId, "--json");
    assertTrue(cps.contains(killedId), "run 2's start committed Kafka's checkpoint " + killedId + ": " + cps);
    assertTrue(cps.contains("lines.input.0"), "with its input offsets: " + cps);
    String check = JniJobTest.blobsnap(work, bucket, "check", "--job", JOB, "--job-id", jobId, "--read-data");
    System.out.printf("kafka job: run 1 killed before cleanUp of checkpoint %s (offset %d); unlock: %s; gc: %s;"
            + " run 2 restored %d lines from Kafka's checkpoint and finished; counts exact (%d words); %.1f s%n%s%n",
        killedId, killedAt, unlock.trim(), gc.trim(), resumed + 1, expected.size() - 1,
        (System.nanoTime() - t0) / 1e9, check);
  }

  static String lastWrittenId(List<String> events) {
    String id = null;
    for (String e : events) {
      Matcher m = JniJobTest.WRITTEN.matcher(e);
      if (m.matches()) {
        id = m.group(1);
      }
    }
    if (id == null) {
      fail("no checkpoint written: " + events);
    }
    return id;
  }
}
