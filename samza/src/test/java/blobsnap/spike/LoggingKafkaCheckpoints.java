package blobsnap.spike;

import org.apache.samza.checkpoint.CheckpointManager;
import org.apache.samza.checkpoint.kafka.KafkaCheckpointManagerFactory;
import org.apache.samza.config.Config;
import org.apache.samza.metrics.MetricsRegistry;

/**
 * Samza's own Kafka checkpoint manager, with each checkpoint it wrote and read logged to the job's
 * event file (as {@link LoggingBlobsnapCheckpoints}), so that a test waits for a commit.
 */
public class LoggingKafkaCheckpoints extends KafkaCheckpointManagerFactory {
  @Override
  public CheckpointManager getCheckpointManager(Config config, MetricsRegistry registry) {
    return LoggingBlobsnapCheckpoints.wrap(super.getCheckpointManager(config, registry), config);
  }
}
