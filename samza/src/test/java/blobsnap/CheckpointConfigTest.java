package blobsnap;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.HashMap;
import java.util.Map;
import org.apache.samza.config.MapConfig;
import org.junit.jupiter.api.Test;

/**
 * Which checkpoint managers route 1 runs under: blobsnap's (its history is the commit point),
 * another one such as Kafka's (prepared history records), and what it refuses at start.
 */
class CheckpointConfigTest {
  static final String KAFKA = "org.apache.samza.checkpoint.kafka.KafkaCheckpointManagerFactory";

  static MapConfig config(String factory, String... more) {
    Map<String, String> c = new HashMap<>();
    c.put("task.checkpoint.write.versions", "2");
    if (factory != null) {
      c.put("task.checkpoint.factory", factory);
    }
    for (int i = 0; i + 1 < more.length; i += 2) {
      c.put(more[i], more[i + 1]);
    }
    return new MapConfig(c);
  }

  @Test
  void blobsnapsCheckpointsOrAnotherManagersWithPreparedRecords() {
    assertFalse(BlobStoreStateBackendFactory.requireCheckpointConfig(
        config(BlobsnapCheckpointManagerFactory.class.getName())));
    assertTrue(BlobStoreStateBackendFactory.requireCheckpointConfig(config(KAFKA)));
  }

  @Test
  void refusedAtStartNamed() {
    BlobsnapException none = assertThrows(BlobsnapException.class,
        () -> BlobStoreStateBackendFactory.requireCheckpointConfig(config(null)));
    assertEquals("invalid-input", none.kind());
    assertTrue(none.getMessage().contains("task.checkpoint.factory is not set"), none.getMessage());

    BlobsnapException v1 = assertThrows(BlobsnapException.class, () -> BlobStoreStateBackendFactory
        .requireCheckpointConfig(config(KAFKA, "task.checkpoint.write.versions", "1,2")));
    assertTrue(v1.getMessage().contains("task.checkpoint.write.versions must be 2"), v1.getMessage());

    BlobsnapException startFrom = assertThrows(BlobsnapException.class, () -> BlobStoreStateBackendFactory
        .requireCheckpointConfig(config(KAFKA, "blobsnap.job.start-from", "savepoint:before")));
    assertEquals("invalid-input", startFrom.kind());
    assertTrue(startFrom.getMessage().contains("blobsnap.job.start-from") && startFrom.getMessage().contains(KAFKA)
        && startFrom.getMessage().contains(BlobsnapCheckpointManagerFactory.class.getName()), startFrom.getMessage());
    // With blobsnap's checkpoints a start-from is applied at the claim.
    assertFalse(BlobStoreStateBackendFactory.requireCheckpointConfig(config(
        BlobsnapCheckpointManagerFactory.class.getName(), "blobsnap.job.start-from", "savepoint:before")));
  }
}
