package blobsnap.samza;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import org.apache.samza.SamzaException;
import org.apache.samza.storage.blobstore.Metadata;

/**
 * What {@link S3BlobStoreManager} checks in a snapshot index's JSON, on its way up (it must be
 * a JSON object naming the request's job, job id, task and store) and on its way down (also:
 * blobsnap {@code format-version} at most {@link S3BlobStoreManager#SAMZA_FORMAT}, the only
 * shape Samza's reader understands, and the checkpoint its marker names). The bytes' SHA-256 is
 * checked where they are read ({@link ObjectReader#readIndex}); every refusal is a
 * {@link SamzaException} naming the index.
 */
final class SnapshotIndexes {
  private static final ObjectMapper JSON = new ObjectMapper();

  private SnapshotIndexes() {
  }

  /** The index's root, which must be a JSON object; {@code what} names it in messages. */
  static JsonNode parse(byte[] bytes, String what) {
    try {
      JsonNode root = JSON.readTree(bytes);
      if (root == null || !root.isObject()) {
        throw new SamzaException("blobsnap: " + what + " is not a JSON object");
      }
      return root;
    } catch (IOException e) {
      throw new SamzaException("blobsnap: " + what + " is not JSON: " + e.getMessage(), e);
    }
  }

  /** The index's snapshot-metadata must name the request's job, job id, task and store. */
  static void checkNames(JsonNode meta, Metadata md, String what) {
    String[][] pairs = {{"job-name", md.getJobName()}, {"job-id", md.getJobId()}, {"task-name", md.getTaskName()},
        {"store-name", md.getStoreName()}};
    for (String[] p : pairs) {
      String v = meta.path(p[0]).asText(null);
      if (!p[1].equals(v)) {
        throw new SamzaException("blobsnap: " + what + " has snapshot-metadata " + p[0] + " " + Layout.quote(v)
            + ", the request is for " + Layout.quote(p[1]) + " (job " + md.getJobName() + "/" + md.getJobId()
            + ", task " + md.getTaskName() + ", store " + md.getStoreName() + ")");
      }
    }
  }

  /**
   * The index {@code bytes}, read from {@code url} under the marker {@code id}, parsed and
   * checked for Samza's reader: a JSON object of blobsnap {@code format-version} 1 (or none),
   * naming the request's job, task and store, of the checkpoint the marker names.
   */
  static void checkRestorable(byte[] bytes, String url, Layout.ParsedId id, Metadata md) {
    JsonNode root = parse(bytes, "index " + url);
    int format = root.path("format-version").asInt(1);
    if (!root.path("format-version").isMissingNode() && !root.path("format-version").canConvertToInt()) {
      throw new SamzaException("blobsnap: index " + url + " has a format-version that is not a number");
    }
    if (format > S3BlobStoreManager.SAMZA_FORMAT) {
      throw new SamzaException("blobsnap: index " + url + " is blobsnap format-version " + format
          + " (inline files or a fork's borrowed blobs), which Samza's blob-store engine cannot restore: "
          + "restore it with blobsnap, or have blobsnap write Samza's shape ([job] index-inline-below = 0, no fork)");
    }
    checkNames(root.path("snapshot-metadata"), md, "index " + url);
    String cp = root.path("snapshot-metadata").path("checkpoint-id").asText(null);
    if (!id.checkpointId.equals(cp)) {
      throw new SamzaException("blobsnap: index " + url + " is of checkpoint " + Layout.quote(cp)
          + ", its marker names " + id.checkpointId);
    }
  }
}
