package blobsnap;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.util.Collections;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.AdminClient;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.samza.Partition;
import org.apache.samza.checkpoint.Checkpoint;
import org.apache.samza.checkpoint.CheckpointId;
import org.apache.samza.checkpoint.CheckpointManager;
import org.apache.samza.checkpoint.CheckpointV2;
import org.apache.samza.checkpoint.kafka.KafkaCheckpointManagerFactory;
import org.apache.samza.config.MapConfig;
import org.apache.samza.container.TaskName;
import org.apache.samza.metrics.MetricsRegistryMap;
import org.apache.samza.system.SystemStreamPartition;
import org.apache.samza.util.KafkaUtil;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * Samza 1.8.0's OWN Kafka checkpoint manager ({@code KafkaCheckpointManagerFactory}, samza-kafka
 * with its kafka-clients 2.4.1) writes a CheckpointV2 carrying blobsnap's state checkpoint
 * markers to a real Kafka broker, and a new manager reads it back unchanged: the one checkpoint
 * manager of Samza 1.8.0 that writes V2 (docs/samza.md, "Checkpoint managers in Samza 1.8.0")
 * works with the markers blobsnap's backend puts under its key.
 *
 * <p>The broker is minio/kafka.sh's (Kafka 3.9, KRaft, a JVM of its own on 127.0.0.1; none of its
 * jars are on this classpath); BLOBSNAP_TEST_KAFKA names it ({@code 127.0.0.1:PORT}). Without it
 * the test FAILS: it never skips.
 */
class KafkaCheckpointSmokeTest {
  static final String MARKER_KEY = "blobsnap.BlobStoreStateBackendFactory";

  static {
    // Kafka's clients print every config they are made with at INFO (a thousand lines for the
    // dozen clients Samza's manager makes): slf4j-simple reads a logger's level when the logger
    // is made, and no other test of this JVM makes Kafka's.
    System.setProperty("org.slf4j.simpleLogger.log.org.apache.kafka", "warn");
  }

  /** The broker's address, or a failure that says how to get one. */
  static String broker() {
    String addr = System.getenv("BLOBSNAP_TEST_KAFKA");
    if (addr == null || addr.trim().isEmpty()) {
      fail("BLOBSNAP_TEST_KAFKA is not set: this test needs a Kafka broker. Start one with "
          + "`bash minio/kafka.sh install && bash minio/kafka.sh start` and export what "
          + "`bash minio/kafka.sh env` prints (BLOBSNAP_TEST_KAFKA=127.0.0.1:PORT); "
          + "scripts/test.sh does both");
    }
    addr = addr.trim();
    int colon = addr.lastIndexOf(':');
    if (colon <= 0) {
      fail("BLOBSNAP_TEST_KAFKA must be HOST:PORT, got '" + addr + "'");
    }
    // Kafka's clients retry an absent broker for minutes: say at once that nothing listens.
    try (Socket s = new Socket()) {
      s.connect(new InetSocketAddress(addr.substring(0, colon), Integer.parseInt(addr.substring(colon + 1))), 5000);
    } catch (IOException | NumberFormatException e) {
      fail("no Kafka broker answers at BLOBSNAP_TEST_KAFKA=" + addr + " (" + e + "); is minio/kafka.sh's broker started?");
    }
    return addr;
  }

  /** A job's config for Kafka's checkpoint manager: every key it needs, and no more. */
  static MapConfig config(String broker, String jobName, String jobId) {
    Map<String, String> c = new HashMap<>();
    c.put("job.name", jobName);
    c.put("job.id", jobId);
    // What a job names; the test calls the factory itself.
    c.put("task.checkpoint.factory", KafkaCheckpointManagerFactory.class.getName());
    c.put("task.checkpoint.system", "kafka");
    // The default is 3 (one broker here: the topic's creation would fail).
    c.put("task.checkpoint.replication.factor", "1");
    // V2 only, as route 1 runs (docs/samza.md): the defaults write V1 too and read V1 only.
    c.put("task.checkpoint.write.versions", "2");
    c.put("task.checkpoint.read.versions", "2,1");
    c.put("systems.kafka.samza.factory", "org.apache.samza.system.kafka.KafkaSystemFactory");
    c.put("systems.kafka.consumer.bootstrap.servers", broker);
    c.put("systems.kafka.producer.bootstrap.servers", broker);
    return new MapConfig(c);
  }

  static CheckpointManager manager(MapConfig config) {
    CheckpointManager m = new KafkaCheckpointManagerFactory().getCheckpointManager(config, new MetricsRegistryMap());
    assertNotNull(m, "KafkaCheckpointManagerFactory returned no manager");
    return m;
  }

  static CheckpointV2 checkpoint(String offset, String snapshot) {
    Map<SystemStreamPartition, String> offsets = new LinkedHashMap<>();
    offsets.put(new SystemStreamPartition("kafka", "lines", new Partition(0)), offset);
    offsets.put(new SystemStreamPartition("kafka", "other-input", new Partition(0)), "17");
    CheckpointId id = CheckpointId.create();
    Map<String, String> stores = new LinkedHashMap<>();
    stores.put("counts", "blobsnap:" + snapshot + ":" + id.serialize());
    stores.put("totals", "blobsnap:" + snapshot + "-t:" + id.serialize());
    return new CheckpointV2(id, offsets, Collections.singletonMap(MARKER_KEY, stores));
  }

  @Test
  @Timeout(value = 180, unit = TimeUnit.SECONDS, threadMode = Timeout.ThreadMode.SEPARATE_THREAD)
  void samzasKafkaCheckpointManagerWritesAndReadsACheckpointV2() throws Exception {
    String broker = broker();
    // A topic of this run's own: a rerun on the same broker starts from an empty one.
    String jobName = "blobsnap-kafka-smoke";
    String jobId = UUID.randomUUID().toString().substring(0, 8);
    MapConfig config = config(broker, jobName, jobId);
    TaskName task = new TaskName("Partition 0");

    CheckpointV2 first = checkpoint("1499", "snap-1");
    CheckpointV2 last = checkpoint("2999", "snap-2");

    CheckpointManager writer = manager(config);
    try {
      writer.register(task);
      writer.createResources();
      writer.start();
      assertNull(writer.readLastCheckpoint(task), "a new checkpoint topic held a checkpoint");
      writer.writeCheckpoint(task, first);
      writer.writeCheckpoint(task, last);
    } finally {
      writer.stop();
    }

    // The topic is Samza's own (created by createResources, not by the broker's auto-creation):
    // one partition, compacted.
    String topic = KafkaUtil.getCheckpointTopic(jobName, jobId, config);
    Properties ap = new Properties();
    ap.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, broker);
    try (AdminClient admin = AdminClient.create(ap)) {
      TopicDescription d = admin.describeTopics(Collections.singleton(topic)).all().get(60, TimeUnit.SECONDS).get(topic);
      assertEquals(1, d.partitions().size(), "partitions of " + topic);
      ConfigResource r = new ConfigResource(ConfigResource.Type.TOPIC, topic);
      Config tc = admin.describeConfigs(Collections.singleton(r)).all().get(60, TimeUnit.SECONDS).get(r);
      assertEquals("compact", tc.get("cleanup.policy").value(), "cleanup.policy of " + topic);
    }

    // A new manager (a restarted container) reads the last checkpoint back, as written.
    CheckpointManager reader = manager(config);
    try {
      reader.register(task);
      reader.createResources();
      reader.start();
      Checkpoint read = reader.readLastCheckpoint(task);
      assertNotNull(read, "no checkpoint read back from " + topic);
      assertTrue(read instanceof CheckpointV2, "read back a " + read.getClass().getName() + ", not a CheckpointV2: " + read);
      CheckpointV2 v2 = (CheckpointV2) read;
      assertEquals(last.getCheckpointId(), v2.getCheckpointId());
      assertEquals(last.getOffsets(), v2.getOffsets());
      assertEquals(last.getStateCheckpointMarkers(), v2.getStateCheckpointMarkers());
      assertEquals(last.getStateCheckpointMarkers().get(MARKER_KEY), v2.getStateCheckpointMarkers().get(MARKER_KEY));
      assertEquals(last, v2);
    } finally {
      reader.stop();
    }

    // Samza's default task.checkpoint.read.versions is "1": a manager left at it skips the V2
    // record ("Ignoring unknown checkpoint key type") and finds no checkpoint at all.
    Map<String, String> v1Only = new HashMap<>(config);
    v1Only.remove("task.checkpoint.read.versions");
    CheckpointManager v1Reader = manager(new MapConfig(v1Only));
    try {
      v1Reader.register(task);
      v1Reader.start();
      assertNull(v1Reader.readLastCheckpoint(task), "a manager reading V1 only found a checkpoint");
    } finally {
      v1Reader.stop();
    }
  }
}
