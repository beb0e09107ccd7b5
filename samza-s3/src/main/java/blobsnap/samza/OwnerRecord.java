package blobsnap.samza;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.util.function.Supplier;
import org.apache.samza.SamzaException;
import org.apache.samza.storage.blobstore.Metadata;
import org.apache.samza.storage.blobstore.exceptions.DeletedException;
import org.apache.samza.storage.blobstore.exceptions.RetriableException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import software.amazon.awssdk.core.ResponseInputStream;
import software.amazon.awssdk.core.sync.RequestBody;
import software.amazon.awssdk.services.s3.model.GetObjectResponse;
import software.amazon.awssdk.services.s3.model.HeadObjectResponse;

/**
 * The owner record of every job scope {@link S3BlobStoreManager} writes,
 * {@code <prefix><job>/<job-id>/scope.json}, naming {@code "engine": "samza-blob-store"}
 * ({@link S3BlobStoreManager#ENGINE}) and {@code "history": "prepared"} ({@link History}: blobsnap's
 * sweep reads the scope's roots as its own; a record without it makes the sweep refuse the scope).
 * Before the first put into a job scope (once per process and bucket: the scopes found or made
 * Samza's are remembered in {@link S3Transport#ownedScopes}) it is written create-only; a record
 * already there must name that engine, and anything else (a blobsnap deployment's record, which
 * names no engine; another engine; an unreadable object) fails the put with a
 * {@link SamzaException} naming the key, because the two engines' collectors would delete each
 * other's blobs.
 *
 * <p>Logs under the manager's logger name.
 */
final class OwnerRecord {
  private static final Logger LOG = LoggerFactory.getLogger(S3BlobStoreManager.class);
  private static final ObjectMapper JSON = new ObjectMapper();

  /**
   * The owner record's {@code history}: this manager keeps Samza's commits in blobsnap's layout
   * ({@link History}), so blobsnap's sweep reads its roots (the Rust {@code PREPARED_HISTORY}).
   */
  static final String HISTORY = "prepared";

  /** The largest owner record read back (blobsnap's are a few hundred bytes). */
  static final long MAX_BYTES = 64L << 10;

  private final S3Settings settings;
  private final Supplier<S3Transport> transport;
  private final ObjectReader reader;
  private final CreateOnlyPut puts;

  /**
   * @param settings the bucket and prefix
   * @param transport the manager's shared transport (throws once the manager is closed)
   * @param reader reads an existing record
   * @param puts writes a missing one
   */
  OwnerRecord(S3Settings settings, Supplier<S3Transport> transport, ObjectReader reader, CreateOnlyPut puts) {
    this.settings = settings;
    this.transport = transport;
    this.reader = reader;
    this.puts = puts;
  }

  /**
   * The owner record of a job scope Samza's engine writes, as blobsnap's Rust {@code ScopeRecord}
   * (kebab-case JSON): {@code {"deployment-id":"samza-blob-store","job-name":<job>,
   * "job-id":<job-id>,"engine":"samza-blob-store"}}, the names unescaped.
   */
  static byte[] bytes(String job, String jobId) {
    ObjectNode n = JSON.createObjectNode();
    n.put("deployment-id", S3BlobStoreManager.DEPLOYMENT_ID);
    n.put("job-name", job);
    n.put("job-id", jobId);
    n.put("engine", S3BlobStoreManager.ENGINE);
    n.put("history", HISTORY);
    try {
      return JSON.writeValueAsBytes(n);
    } catch (IOException e) {
      throw new IllegalStateException("blobsnap: serializing the owner record", e);
    }
  }

  /**
   * Before the first put into the request's job scope (once per process and bucket): make sure
   * its owner record {@code <prefix><job>/<job-id>/scope.json} exists and names Samza's engine.
   * Written create-only; a record already there must name {@link S3BlobStoreManager#ENGINE}
   * ({@link #check}). Only a scope found or made Samza's is remembered: a refusal or a transient
   * failure is met again by the next put.
   */
  void ensure(Metadata md) {
    S3Transport t = transport.get();
    String key = S3BlobStoreManager.key(Layout.jobScope(settings.prefix, md.getJobName(), md.getJobId()),
        Layout.OWNER_RECORD);
    if (t.ownedScopes.contains(key)) {
      return;
    }
    byte[] bytes = bytes(md.getJobName(), md.getJobId());
    puts.put(key, RequestBody.fromBytes(bytes), bytes.length, S3BlobStoreManager.sha256().digest(bytes),
        "the owner record", this::check);
    if (t.ownedScopes.add(key)) {
      LOG.info("blobsnap: job scope {} is Samza's blob-store engine's (owner record {}, engine \"{}\"): "
          + "its commits go into blobsnap's history at each cleanUp", reader.url(key.substring(0, key.length() - Layout.OWNER_RECORD.length())),
          reader.url(key), S3BlobStoreManager.ENGINE);
    }
  }

  /**
   * After a commit into blobsnap's history: a record made before prepared history records (no
   * {@code history}) gets it once every task with snapshots in the scope has a checkpoint in the
   * history ({@code everyTaskHasAHistory}), so that blobsnap's sweep stops refusing the scope:
   * from then on each task's restart point is in its history or prepared. Checked at each commit
   * until then; once per process and scope after.
   */
  void recordHistory(Metadata md, java.util.function.Predicate<Metadata> everyTaskHasAHistory) {
    S3Transport t = transport.get();
    String key = S3BlobStoreManager.key(Layout.jobScope(settings.prefix, md.getJobName(), md.getJobId()),
        Layout.OWNER_RECORD);
    if (t.historyScopes.contains(key)) {
      return;
    }
    byte[] bytes = read(key);
    JsonNode root;
    try {
      root = bytes == null ? null : JSON.readTree(bytes);
    } catch (IOException e) {
      root = null;
    }
    if (root == null || !root.isObject() || problem(bytes) != null) {
      throw new SamzaException("blobsnap: the owner record " + reader.url(key) + " is no longer Samza's engine's");
    }
    if (!HISTORY.equals(root.path("history").asText(null))) {
      if (!everyTaskHasAHistory.test(md)) {
        return;
      }
      ((ObjectNode) root).put("history", HISTORY);
      byte[] updated;
      try {
        updated = JSON.writeValueAsBytes(root);
      } catch (IOException e) {
        throw new IllegalStateException("blobsnap: serializing the owner record", e);
      }
      try {
        t.client.putObject(software.amazon.awssdk.services.s3.model.PutObjectRequest.builder()
            .bucket(settings.bucket).key(key).contentLength((long) updated.length).contentType("application/json")
            .build(), RequestBody.fromBytes(updated));
      } catch (software.amazon.awssdk.core.exception.SdkException e) {
        throw Errors.toSamza("put " + reader.url(key), e);
      }
      LOG.info("blobsnap: owner record {} now says \"history\": \"{}\": blobsnap gc sweeps the scope from here on",
          reader.url(key), HISTORY);
    }
    t.historyScopes.add(key);
  }

  /**
   * An owner record already under {@code key}: fine when its {@code engine} is
   * {@link S3BlobStoreManager#ENGINE}; anything else (a blobsnap deployment's record, which names
   * no engine; another engine; an unreadable object) is a {@link SamzaException} naming the key.
   */
  private void check(String key, HeadObjectResponse existing) {
    String found;
    Long size = existing.contentLength();
    if (size != null && size > MAX_BYTES) {
      found = "is " + size + " bytes, too large for an owner record";
    } else {
      byte[] bytes = read(key);
      found = bytes == null ? "is over " + MAX_BYTES + " bytes, too large for an owner record"
          : problem(bytes);
      if (found == null) {
        return;
      }
    }
    throw new SamzaException("blobsnap: put into job scope " + reader.url(key.substring(0, key.length()
        - Layout.OWNER_RECORD.length())) + ": its owner record " + reader.url(key) + " exists and " + found
        + ": the job scope belongs to another deployment or engine, not to Samza's blob-store engine (engine \""
        + S3BlobStoreManager.ENGINE + "\"). Samza's engine must not write into it: the two engines' garbage "
        + "collectors would delete each other's blobs (each sees only its own commits as roots). Use another job "
        + "id (job.id) or prefix (" + S3Settings.PREFIX + ")");
  }

  /** Why the owner record {@code bytes} is not Samza's engine's; null when it is. */
  private static String problem(byte[] bytes) {
    JsonNode root;
    try {
      root = JSON.readTree(bytes);
    } catch (IOException e) {
      String why = e instanceof com.fasterxml.jackson.core.JsonProcessingException
          ? ((com.fasterxml.jackson.core.JsonProcessingException) e).getOriginalMessage() : e.getMessage();
      return "is not JSON (" + why + ")";
    }
    if (root == null || !root.isObject()) {
      return "is not a JSON object";
    }
    JsonNode engine = root.path("engine");
    if (engine.isTextual() && S3BlobStoreManager.ENGINE.equals(engine.asText())) {
      return null;
    }
    String deployment = root.path("deployment-id").isTextual()
        ? "deployment-id " + Layout.quote(root.path("deployment-id").asText()) : "no deployment-id";
    if (engine.isMissingNode() || engine.isNull()) {
      return "names no engine (" + deployment + ", a blobsnap deployment's: its own job runtime writes the scope)";
    }
    return "names engine " + engine + " (" + deployment + ")";
  }

  /** The owner record's bytes (null when over the cap); it vanishing after a 412 or HEAD is retriable. */
  private byte[] read(String key) {
    ResponseInputStream<GetObjectResponse> in;
    try {
      in = reader.open(key);
    } catch (DeletedException e) {
      throw new RetriableException("blobsnap: " + reader.url(key) + " existed (HEAD or 412), then not found: retry",
          e);
    }
    boolean drained = false;
    try {
      byte[] bytes = ObjectReader.readCapped(in, MAX_BYTES);
      drained = bytes != null;
      return bytes;
    } catch (IOException e) {
      throw Errors.toSamza("get " + reader.url(key), e);
    } finally {
      ObjectReader.closeQuietly(in, drained);
    }
  }
}
