package blobsnap.samza;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.Base64;
import java.util.concurrent.Callable;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.samza.SamzaException;
import org.apache.samza.storage.blobstore.BlobStoreManager;
import org.apache.samza.storage.blobstore.Metadata;
import org.apache.samza.storage.blobstore.exceptions.DeletedException;
import org.apache.samza.storage.blobstore.exceptions.RetriableException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import software.amazon.awssdk.auth.credentials.AwsCredentialsProvider;
import software.amazon.awssdk.core.ResponseInputStream;
import software.amazon.awssdk.core.exception.SdkException;
import software.amazon.awssdk.core.sync.RequestBody;
import software.amazon.awssdk.services.s3.model.ChecksumMode;
import software.amazon.awssdk.services.s3.model.GetObjectRequest;
import software.amazon.awssdk.services.s3.model.GetObjectResponse;
import software.amazon.awssdk.services.s3.model.HeadObjectRequest;
import software.amazon.awssdk.services.s3.model.HeadObjectResponse;
import software.amazon.awssdk.services.s3.model.PutObjectRequest;
import software.amazon.awssdk.services.s3.model.S3Exception;

/**
 * Samza's {@link BlobStoreManager} on S3, writing blobsnap's bucket layout (DESIGN §5), so that
 * Samza's own blob-store engine ({@code BlobStoreBackupManager}, {@code BlobStoreRestoreManager},
 * {@code BlobStoreUtil}) and blobsnap read each other's snapshots. Configure it with
 * {@code blob.store.manager.factory=blobsnap.samza.S3BlobStoreManagerFactory} and the
 * {@code blobsnap.s3.*} keys of {@link S3Settings}.
 *
 * <ul>
 *   <li><b>put of a file</b> ({@code Metadata.payloadPath} is its local path): the stream Samza
 *       hands over is read to the end once (so Samza's CRC32 of it is right) while its SHA-256 is
 *       computed; then the file is sent from its path, create-only ({@code If-None-Match: *}),
 *       with {@code x-amz-checksum-sha256}, under
 *       {@code <prefix><job>/<job-id>/tasks/<task>/stores/<store>/blobs/<checkpoint-id>/<sha256>}.
 *       The checkpoint id is that of the checkpoint dir the file lies in
 *       ({@link Layout#checkpointIdOfFile}). The blob id returned, and stored in Samza's index,
 *       is scope-relative: {@code blobs/<checkpoint-id>/<sha256>}, as in blobsnap's own indexes.
 *       A key that exists already holds the same bytes (its name is their hash): that is
 *       success, once the object's size and SHA-256 are checked.</li>
 *   <li><b>put of an index</b> (payloadPath {@code "snapshot-index"}): its exact bytes are
 *       hashed and stored create-only under {@code .../index/<checkpoint-id>.<sha256>.json}; the
 *       id returned, which Samza puts into the CheckpointV2 as the store's marker, is blobsnap's
 *       marker {@code index/<checkpoint-id>.<sha256>.json}.</li>
 *   <li><b>the owner record</b>: before the first put into a job scope (per process), the
 *       scope's {@code <prefix><job>/<job-id>/scope.json} is made to exist, create-only, naming
 *       {@code "engine": "samza-blob-store"} ({@link #ownerRecord}), so that {@code blobsnap gc}
 *       refuses to sweep the scope (its roots are not Samza's commits). A record already there
 *       must name that engine: a scope of a blobsnap deployment (or anything else) fails the put
 *       with a {@link SamzaException}, because the two engines' collectors would delete each
 *       other's blobs.</li>
 *   <li><b>get</b> streams the object into Samza's stream and checks its SHA-256 against the id
 *       (both shapes are content-addressed); an index must also be one Samza's reader can use
 *       (blobsnap {@code format-version} 1) and name this job, task and store.</li>
 *   <li><b>delete</b> is deferred to blobsnap's garbage collection: a no-op that logs (see
 *       README.md: immediate deletes would keep one point of history only).</li>
 *   <li><b>removeTTL</b>: S3 objects have no TTL; for an index it calls the hook
 *       {@link #onIndexCommitted}.</li>
 * </ul>
 *
 * <p>Every call returns at once: the S3 requests run on a bounded pool shared by the process
 * ({@link S3Transport}), and each returned future is completed on the executor Samza gave the
 * factory, so Samza's dependent stages never run on an I/O thread and nothing blocks Samza's
 * run loop. Failures are Samza's exception types ({@link Errors}): a missing key is a
 * {@link DeletedException}; 5xx, throttling, timeouts and I/O errors are
 * {@link RetriableException}s (Samza retries them); the rest are {@link SamzaException}s naming
 * the key.
 */
public class S3BlobStoreManager implements BlobStoreManager {
  private static final Logger LOG = LoggerFactory.getLogger(S3BlobStoreManager.class);

  /** The largest index blobsnap's readers accept (and so the largest this manager writes). */
  public static final long MAX_INDEX_BYTES = 64L << 20;
  /** S3's largest single PUT: larger files are refused (no multipart upload here). */
  public static final long MAX_SINGLE_PUT = 5L << 30;
  /** The newest index format Samza's reader understands: blobsnap's v1 is Samza's shape. */
  public static final int SAMZA_FORMAT = 1;
  /**
   * The {@code engine} of the owner record ({@code <job>/<job-id>/scope.json}) of every job
   * scope this manager writes: the Rust {@code admin::SAMZA_ENGINE}. blobsnap's sweep refuses a
   * scope whose record names it (Samza's commits are not under {@code checkpoints/}, where the
   * sweep finds its roots).
   */
  public static final String ENGINE = "samza-blob-store";
  /** The owner record's {@code deployment-id}: Samza's engine belongs to no blobsnap deployment. */
  public static final String DEPLOYMENT_ID = "samza-blob-store";
  /** The largest owner record read back (blobsnap's are a few hundred bytes). */
  static final long MAX_OWNER_RECORD_BYTES = 64L << 10;

  private static final ObjectMapper JSON = new ObjectMapper();

  private final S3Settings settings;
  private final ExecutorService callbacks;
  private final AwsCredentialsProvider credentials;
  private final Object lock = new Object();
  private S3Transport transport;
  private final AtomicBoolean closed = new AtomicBoolean();
  private final AtomicBoolean deleteLogged = new AtomicBoolean();
  private final AtomicLong deferredDeletes = new AtomicLong();

  /**
   * @param settings where and how
   * @param samzaExecutor the executor Samza gave the factory: returned futures complete on it
   *     (null: on the I/O thread)
   */
  public S3BlobStoreManager(S3Settings settings, ExecutorService samzaExecutor) {
    this(settings, samzaExecutor, null);
  }

  /**
   * As {@link #S3BlobStoreManager(S3Settings, ExecutorService)}, with explicit credentials
   * instead of the AWS SDK's default chain (embedding; tests).
   */
  public S3BlobStoreManager(S3Settings settings, ExecutorService samzaExecutor, AwsCredentialsProvider credentials) {
    this.settings = settings;
    this.callbacks = samzaExecutor;
    this.credentials = credentials;
  }

  /** The settings. */
  public S3Settings settings() {
    return settings;
  }

  /** How many deletes this manager deferred (left to blobsnap's GC). */
  public long deferredDeletes() {
    return deferredDeletes.get();
  }

  @Override
  public void init() {
    transport();
  }

  @Override
  public void close() {
    if (closed.compareAndSet(false, true)) {
      S3Transport t;
      synchronized (lock) {
        t = transport;
        transport = null;
      }
      if (t != null) {
        t.release();
      }
    }
  }

  private S3Transport transport() {
    synchronized (lock) {
      if (closed.get()) {
        throw new SamzaException("blobsnap: the S3 blob store manager for " + settings + " is closed");
      }
      if (transport == null) {
        transport = S3Transport.acquire(settings, credentials);
      }
      return transport;
    }
  }

  // ---- the BlobStoreManager calls ----

  @Override
  public CompletionStage<String> put(InputStream inputStream, Metadata metadata) {
    return async(() -> {
      String scope = scope(metadata);
      if (Metadata.SNAPSHOT_INDEX_PAYLOAD_PATH.equals(metadata.getPayloadPath())) {
        return putIndex(inputStream, metadata, scope);
      }
      return putFile(inputStream, metadata, scope);
    }, "put " + metadata.getPayloadPath());
  }

  @Override
  public CompletionStage<Void> get(String id, OutputStream outputStream, Metadata metadata) {
    return async(() -> {
      Layout.ParsedId parsed = Layout.parseId(id);
      String key = key(scope(metadata), id);
      if (parsed.index) {
        getIndex(key, parsed, outputStream, metadata);
      } else {
        getBlob(key, parsed, outputStream);
      }
      return null;
    }, "get " + id);
  }

  /**
   * Deferred: blobs and indexes are deleted by blobsnap's garbage collection, which keeps every
   * retained checkpoint and savepoint (DESIGN §10), never by Samza's one-step-of-history
   * cleanup. Checks the id, logs, and completes.
   */
  @Override
  public CompletionStage<Void> delete(String id, Metadata metadata) {
    try {
      Layout.parseId(id);
      String key = key(scope(metadata), id);
      deferredDeletes.incrementAndGet();
      if (deleteLogged.compareAndSet(false, true)) {
        LOG.info("blobsnap: deletes are deferred to blobsnap's garbage collection (first: s3://{}/{}); "
            + "Samza's cleanup deletes nothing from the bucket", settings.bucket, key);
      } else {
        LOG.debug("blobsnap: delete of s3://{}/{} deferred to blobsnap's garbage collection", settings.bucket, key);
      }
      return completed(null);
    } catch (RuntimeException e) {
      return failed(e);
    }
  }

  /**
   * S3 objects have no TTL: a blob needs nothing. An index's TTL removal is Samza's signal that
   * its checkpoint is committed (its cleanUp runs it after the CheckpointV2 write, and after the
   * TTL removal of every file of the snapshot): that calls {@link #onIndexCommitted}.
   */
  @Override
  public CompletionStage<Void> removeTTL(String blobId, Metadata metadata) {
    try {
      Layout.ParsedId parsed = Layout.parseId(blobId);
      String scope = scope(metadata);
      key(scope, blobId);
      if (!parsed.index) {
        return completed(null);
      }
      return onIndexCommitted(new CommittedIndex(settings.bucket, scope, blobId, parsed.checkpointId, metadata));
    } catch (RuntimeException e) {
      return failed(e);
    }
  }

  /** What {@link #onIndexCommitted} is told: the index of a store at a committed checkpoint. */
  public static final class CommittedIndex {
    /** The bucket. */
    public final String bucket;
    /** The store's scope ({@code <prefix><job>/<job-id>/tasks/<task>/stores/<store>/}). */
    public final String scope;
    /** The marker, {@code index/<checkpoint-id>.<sha256>.json} (the id in the CheckpointV2). */
    public final String marker;
    /** The checkpoint id. */
    public final String checkpointId;
    /** Samza's request metadata (job, job id, task, store). */
    public final Metadata metadata;

    CommittedIndex(String bucket, String scope, String marker, String checkpointId, Metadata metadata) {
      this.bucket = bucket;
      this.scope = scope;
      this.marker = marker;
      this.checkpointId = checkpointId;
      this.metadata = metadata;
    }

    /** The index's full key. */
    public String key() {
      return scope + marker;
    }
  }

  /**
   * Hook: the index {@code committed} belongs to a checkpoint Samza has committed.
   *
   * <p>TODO(issue 50, route 2): write blobsnap's history record of this committed point here, so
   * that blobsnap's sweep, savepoints and operator commands see Samza's checkpoints as roots.
   * The record's shape is to be designed on the Rust side; until then this does nothing, and
   * {@code blobsnap gc} refuses a scope this manager writes (its owner record names
   * {@link #ENGINE}; README.md). Note that
   * Samza 1.8.0 never runs cleanUp for the checkpoint a job restarts from (docs/samza.md), so
   * this hook misses the last checkpoint before a crash unless the next commit's cleanUp runs.
   *
   * @return a future completed when the record is durable (now: at once)
   */
  protected CompletionStage<Void> onIndexCommitted(CommittedIndex committed) {
    LOG.debug("blobsnap: index s3://{}/{} committed (no history record written yet)", committed.bucket,
        committed.key());
    return completed(null);
  }

  // ---- put ----

  private String putFile(InputStream in, Metadata md, String scope) {
    Path path = Paths.get(md.getPayloadPath());
    if (!path.isAbsolute() || !Files.isRegularFile(path)) {
      throw new SamzaException("blobsnap: put of " + Layout.quote(md.getPayloadPath())
          + ": Metadata.payloadPath must be the absolute path of the regular file being uploaded (or \""
          + Metadata.SNAPSHOT_INDEX_PAYLOAD_PATH + "\" for an index)");
    }
    String checkpointId = Layout.checkpointIdOfFile(path, md.getStoreName());
    // Read Samza's stream to its end: Samza records the CRC32 of exactly what was read.
    MessageDigest sha = sha256();
    long n = 0;
    byte[] buf = new byte[64 << 10];
    try {
      int r;
      while ((r = in.read(buf)) != -1) {
        sha.update(buf, 0, r);
        n += r;
      }
    } catch (IOException e) {
      throw new SamzaException("blobsnap: read " + path + " for upload", e);
    }
    long onDisk;
    try {
      onDisk = Files.size(path);
    } catch (IOException e) {
      throw new SamzaException("blobsnap: stat " + path, e);
    }
    if ((md.getPayloadSize() >= 0 && n != md.getPayloadSize()) || n != onDisk) {
      // Samza re-reads the file's metadata and re-opens its stream on a retry.
      throw new RetriableException("blobsnap: " + path + " changed while it was read for upload (Samza said "
          + md.getPayloadSize() + " bytes, the stream gave " + n + ", the file now has " + onDisk + ")");
    }
    if (n > MAX_SINGLE_PUT) {
      throw new SamzaException("blobsnap: " + path + " is " + n + " bytes, over S3's 5 GiB single PUT; "
          + "this manager does not do multipart uploads");
    }
    byte[] digest = sha.digest();
    String blobId = Layout.blobId(checkpointId, hex(digest));
    String key = key(scope, blobId);
    ensureOwnerRecord(md);
    putCreateOnly(key, RequestBody.fromFile(path), n, digest, path.toString());
    LOG.debug("blobsnap: {} -> s3://{}/{}", path, settings.bucket, key);
    return blobId;
  }

  private String putIndex(InputStream in, Metadata md, String scope) {
    byte[] bytes;
    try {
      bytes = readCapped(in, MAX_INDEX_BYTES);
    } catch (IOException e) {
      throw new SamzaException("blobsnap: read the snapshot index to upload", e);
    }
    if (bytes == null) {
      throw new SamzaException("blobsnap: the snapshot index of store " + Layout.quote(md.getStoreName()) + " of task "
          + Layout.quote(md.getTaskName()) + " is over the " + MAX_INDEX_BYTES
          + "-byte cap every blobsnap reader enforces: not committed");
    }
    if (md.getPayloadSize() >= 0 && bytes.length != md.getPayloadSize()) {
      throw new RetriableException("blobsnap: the snapshot index stream gave " + bytes.length + " bytes, Samza said "
          + md.getPayloadSize());
    }
    JsonNode meta = parseIndex(bytes, "the snapshot index to upload").path("snapshot-metadata");
    checkNames(meta, md, "the snapshot index to upload");
    String checkpointId = meta.path("checkpoint-id").asText(null);
    byte[] digest = sha256().digest(bytes);
    String marker = Layout.marker(checkpointId, hex(digest));
    String key = key(scope, marker);
    ensureOwnerRecord(md);
    putCreateOnly(key, RequestBody.fromBytes(bytes), bytes.length, digest, "the snapshot index");
    LOG.info("blobsnap: index of task {} store {} at checkpoint {}: s3://{}/{}", md.getTaskName(), md.getStoreName(),
        checkpointId, settings.bucket, key);
    return marker;
  }

  /** What an object found under a create-only key must be for the PUT to count as done. */
  private interface ExistingCheck {
    /** Returns when the object at {@code key} will do; throws (Samza's exception types) if not. */
    void check(String key, HeadObjectResponse existing);
  }

  /**
   * PUT {@code body} ({@code len} bytes, SHA-256 {@code digest}) at {@code key} unless it exists;
   * an object already there must have the same size and SHA-256 (its key is their hash).
   */
  private void putCreateOnly(String key, RequestBody body, long len, byte[] digest, String what) {
    putCreateOnly(key, body, len, digest, what, (k, existing) -> verifyExisting(k, existing, len, digest));
  }

  /**
   * PUT {@code body} at {@code key} unless it exists (If-None-Match: *, or a HEAD first when the
   * server ignores it); an object already there, or one found there when the PUT's outcome is
   * unclear, must pass {@code ifExists}.
   */
  private void putCreateOnly(String key, RequestBody body, long len, byte[] digest, String what,
      ExistingCheck ifExists) {
    S3Transport t = transport();
    if (!settings.createOnly.sendsHeader()) {
      // The server ignores If-None-Match (Garage): look first, so that a blob is never written
      // twice (its last-modified is what blobsnap's sweep judges its age by).
      HeadObjectResponse existing = head(key);
      if (existing != null) {
        ifExists.check(key, existing);
        return;
      }
    }
    PutObjectRequest.Builder req = PutObjectRequest.builder()
        .bucket(settings.bucket)
        .key(key)
        .contentLength(len)
        .contentType(key.endsWith(".json") ? "application/json" : "application/octet-stream")
        .checksumSHA256(Base64.getEncoder().encodeToString(digest));
    if (settings.createOnly.sendsHeader()) {
      req.ifNoneMatch("*");
    }
    for (int attempt = 1; ; attempt++) {
      try {
        t.client.putObject(req.build(), body);
        return;
      } catch (S3Exception e) {
        Errors.Kind kind = Errors.kindOf(e);
        if (kind == Errors.Kind.CONFLICT) {
          HeadObjectResponse existing = head(key);
          if (existing == null) {
            throw new RetriableException("blobsnap: put " + url(key) + ": 412 (exists), then not found: retry", e);
          }
          ifExists.check(key, existing);
          LOG.debug("blobsnap: {} is already stored as {}", what, url(key));
          return;
        }
        if (kind == Errors.Kind.CORRUPT) {
          // Each attempt re-reads and re-hashes what it sends: a retry uploads what the file holds then.
          throw new RetriableException(Errors.describe("put " + url(key), e)
              + ": the server says the bytes received do not have the SHA-256 sent (changed while read?)", e);
        }
        RuntimeException failure = settleByReadingBack(key, e, ifExists);
        if (failure != null) {
          throw failure;
        }
        return;
      } catch (SdkException e) {
        RuntimeException failure = settleByReadingBack(key, e, ifExists);
        if (failure == null) {
          return;
        }
        // No response at all (a broken pipe, a reset): most often a pooled connection the
        // server closed after refusing an earlier PUT early (412 before reading its body). A
        // create-only PUT of content-addressed bytes can be sent again as it is: once, at once,
        // on a fresh connection; after that Samza's retries take over (one retry layer).
        if (attempt == 1 && failure instanceof RetriableException && noResponse(e)) {
          LOG.debug("blobsnap: put {} got no response ({}); once more on a fresh connection", url(key), e.toString());
          continue;
        }
        throw failure;
      }
    }
  }

  /** Whether a request failed before any response came (the connection broke under it). */
  private static boolean noResponse(SdkException e) {
    if (e instanceof software.amazon.awssdk.awscore.exception.AwsServiceException) {
      return false;
    }
    for (Throwable c = e.getCause(); c != null; c = c.getCause()) {
      if (c instanceof java.net.SocketException || c.getClass().getSimpleName().equals("NoHttpResponseException")) {
        return true;
      }
    }
    return false;
  }

  /**
   * A PUT that failed without a clear answer (connection reset, broken pipe, timeout, 5xx) may
   * still have stored the object — or found it there: a server may answer 412 before it has read
   * the body and close the connection, which the client sees as a broken pipe. The key is the
   * hash of the bytes, so an object there with our size and SHA-256 is ours: success (the Rust
   * side settles ambiguous create-only PUTs by reading back too): null. (An owner record is
   * judged by its content instead: {@code ifExists}.) Otherwise the failure to throw.
   */
  private RuntimeException settleByReadingBack(String key, SdkException e, ExistingCheck ifExists) {
    RuntimeException original = Errors.toSamza("put " + url(key), e);
    if (!(original instanceof RetriableException)) {
      return original;
    }
    HeadObjectResponse existing;
    try {
      existing = head(key);
    } catch (RuntimeException headFailed) {
      original.addSuppressed(headFailed);
      return original;
    }
    if (existing == null) {
      return original;
    }
    ifExists.check(key, existing);
    LOG.debug("blobsnap: put {} failed ({}), but the object is there and will do", url(key), e.toString());
    return null;
  }

  /** Whether the object at {@code key} has {@code len} bytes with SHA-256 {@code digest}; throws if not. */
  private void verifyExisting(String key, HeadObjectResponse head, long len, byte[] digest) {
    Long size = head.contentLength();
    if (size != null && size != len) {
      throw new SamzaException("blobsnap: " + url(key) + " exists with " + size + " bytes, not " + len
          + ": an object of another writer under a content-addressed key; not overwritten");
    }
    String stored = head.checksumSHA256();
    byte[] actual;
    if (stored != null && !stored.contains("-")) {
      actual = Base64.getDecoder().decode(stored);
    } else {
      actual = hashObject(key);
    }
    if (!MessageDigest.isEqual(actual, digest)) {
      throw new SamzaException("blobsnap: " + url(key) + " exists with other bytes (SHA-256 " + hex(actual)
          + "): an object of another writer under a content-addressed key; not overwritten");
    }
  }

  /** The object's metadata (with its stored SHA-256 when it has one), or null when there is none. */
  private HeadObjectResponse head(String key) {
    HeadObjectRequest req = HeadObjectRequest.builder()
        .bucket(settings.bucket).key(key).checksumMode(ChecksumMode.ENABLED).build();
    for (int attempt = 1; ; attempt++) {
      try {
        return transport().client.headObject(req);
      } catch (SdkException e) {
        Errors.Kind kind = Errors.kindOf(e);
        if (kind == Errors.Kind.NOT_FOUND) {
          return null;
        }
        // A HEAD right after a PUT the server refused early (412 before the body was read)
        // can get that PUT's connection back from the pool, closed by the server: one more
        // try on a fresh connection, for this idempotent read only. Everything else is
        // retried by Samza (one retry layer).
        if (attempt == 1 && kind == Errors.Kind.TRANSIENT && !(e instanceof software.amazon.awssdk.awscore.exception.AwsServiceException)) {
          LOG.debug("blobsnap: head {} failed on a pooled connection ({}); once more", url(key), e.toString());
          continue;
        }
        throw Errors.toSamza("head " + url(key), e);
      }
    }
  }

  private byte[] hashObject(String key) {
    MessageDigest sha = sha256();
    try (ResponseInputStream<GetObjectResponse> in = transport().client.getObject(
        GetObjectRequest.builder().bucket(settings.bucket).key(key).build())) {
      byte[] buf = new byte[64 << 10];
      int r;
      while ((r = in.read(buf)) != -1) {
        sha.update(buf, 0, r);
      }
    } catch (SdkException | IOException e) {
      throw Errors.toSamza("read back " + url(key), e);
    }
    return sha.digest();
  }

  // ---- the owner record ----

  /**
   * The owner record of a job scope Samza's engine writes, as blobsnap's Rust {@code ScopeRecord}
   * (kebab-case JSON): {@code {"deployment-id":"samza-blob-store","job-name":<job>,
   * "job-id":<job-id>,"engine":"samza-blob-store"}}, the names unescaped.
   */
  static byte[] ownerRecord(String job, String jobId) {
    ObjectNode n = JSON.createObjectNode();
    n.put("deployment-id", DEPLOYMENT_ID);
    n.put("job-name", job);
    n.put("job-id", jobId);
    n.put("engine", ENGINE);
    try {
      return JSON.writeValueAsBytes(n);
    } catch (IOException e) {
      throw new IllegalStateException("blobsnap: serializing the owner record", e);
    }
  }

  /**
   * Before the first put into the request's job scope (once per process and bucket): make sure
   * its owner record {@code <prefix><job>/<job-id>/scope.json} exists and names Samza's engine.
   * Written create-only; a record already there must name {@link #ENGINE}
   * ({@link #checkOwnerRecord}). Only a scope found or made Samza's is remembered: a refusal or
   * a transient failure is met again by the next put.
   */
  private void ensureOwnerRecord(Metadata md) {
    S3Transport t = transport();
    String key = key(Layout.jobScope(settings.prefix, md.getJobName(), md.getJobId()), Layout.OWNER_RECORD);
    if (t.ownedScopes.contains(key)) {
      return;
    }
    byte[] bytes = ownerRecord(md.getJobName(), md.getJobId());
    putCreateOnly(key, RequestBody.fromBytes(bytes), bytes.length, sha256().digest(bytes), "the owner record",
        this::checkOwnerRecord);
    if (t.ownedScopes.add(key)) {
      LOG.info("blobsnap: job scope {} is Samza's blob-store engine's (owner record {}, engine \"{}\"): "
          + "blobsnap gc refuses to sweep it", url(key.substring(0, key.length() - Layout.OWNER_RECORD.length())),
          url(key), ENGINE);
    }
  }

  /**
   * An owner record already under {@code key}: fine when its {@code engine} is {@link #ENGINE};
   * anything else (a blobsnap deployment's record, which names no engine; another engine; an
   * unreadable object) is a {@link SamzaException} naming the key.
   */
  private void checkOwnerRecord(String key, HeadObjectResponse existing) {
    String found;
    Long size = existing.contentLength();
    if (size != null && size > MAX_OWNER_RECORD_BYTES) {
      found = "is " + size + " bytes, too large for an owner record";
    } else {
      byte[] bytes = readOwnerRecord(key);
      found = bytes == null ? "is over " + MAX_OWNER_RECORD_BYTES + " bytes, too large for an owner record"
          : ownerRecordProblem(bytes);
      if (found == null) {
        return;
      }
    }
    throw new SamzaException("blobsnap: put into job scope " + url(key.substring(0, key.length()
        - Layout.OWNER_RECORD.length())) + ": its owner record " + url(key) + " exists and " + found
        + ": the job scope belongs to another deployment or engine, not to Samza's blob-store engine (engine \""
        + ENGINE + "\"). Samza's engine must not write into it: the two engines' garbage collectors would delete "
        + "each other's blobs (each sees only its own commits as roots). Use another job id (job.id) or prefix ("
        + S3Settings.PREFIX + ")");
  }

  /** Why the owner record {@code bytes} is not Samza's engine's; null when it is. */
  private static String ownerRecordProblem(byte[] bytes) {
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
    if (engine.isTextual() && ENGINE.equals(engine.asText())) {
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
  private byte[] readOwnerRecord(String key) {
    ResponseInputStream<GetObjectResponse> in;
    try {
      in = open(key);
    } catch (DeletedException e) {
      throw new RetriableException("blobsnap: " + url(key) + " existed (HEAD or 412), then not found: retry", e);
    }
    boolean drained = false;
    try {
      byte[] bytes = readCapped(in, MAX_OWNER_RECORD_BYTES);
      drained = bytes != null;
      return bytes;
    } catch (IOException e) {
      throw Errors.toSamza("get " + url(key), e);
    } finally {
      closeQuietly(in, drained);
    }
  }

  // ---- get ----

  private void getBlob(String key, Layout.ParsedId id, OutputStream out) {
    MessageDigest sha = sha256();
    long n = 0;
    Long expected;
    ResponseInputStream<GetObjectResponse> in = open(key);
    boolean drained = false;
    try {
      expected = in.response().contentLength();
      byte[] buf = new byte[64 << 10];
      while (true) {
        int r;
        try {
          r = in.read(buf);
        } catch (IOException e) {
          throw Errors.toSamza("get " + url(key) + " (after " + n + " bytes)", e);
        }
        if (r == -1) {
          drained = true;
          break;
        }
        sha.update(buf, 0, r);
        n += r;
        try {
          out.write(buf, 0, r);
        } catch (IOException e) {
          // The local side (Samza's file): not the server's fault, not retried here.
          throw new SamzaException("blobsnap: get " + url(key) + ": writing to the local file failed", e);
        }
      }
    } finally {
      closeQuietly(in, drained);
    }
    if (expected != null && n != expected) {
      throw new RetriableException("blobsnap: get " + url(key) + ": the body ended after " + n + " of " + expected
          + " bytes");
    }
    String got = hex(sha.digest());
    if (!got.equals(id.sha256)) {
      throw new SamzaException("blobsnap: get " + url(key) + ": corrupt: its " + n + " bytes have SHA-256 " + got
          + ", its key names " + id.sha256);
    }
  }

  private void getIndex(String key, Layout.ParsedId id, OutputStream out, Metadata md) {
    byte[] bytes;
    ResponseInputStream<GetObjectResponse> in = open(key);
    boolean drained = false;
    try {
      Long len = in.response().contentLength();
      if (len != null && len > MAX_INDEX_BYTES) {
        throw new SamzaException("blobsnap: index " + url(key) + " is " + len + " bytes, over the "
            + MAX_INDEX_BYTES + "-byte cap");
      }
      bytes = readCapped(in, MAX_INDEX_BYTES);
      drained = bytes != null;
    } catch (IOException e) {
      throw Errors.toSamza("get " + url(key), e);
    } finally {
      closeQuietly(in, drained);
    }
    if (bytes == null) {
      throw new SamzaException("blobsnap: index " + url(key) + " is over the " + MAX_INDEX_BYTES + "-byte cap");
    }
    String got = hex(sha256().digest(bytes));
    if (!got.equals(id.sha256)) {
      throw new SamzaException("blobsnap: get " + url(key) + ": corrupt: the index's bytes have SHA-256 " + got
          + ", its marker names " + id.sha256);
    }
    JsonNode root = parseIndex(bytes, "index " + url(key));
    int format = root.path("format-version").asInt(1);
    if (!root.path("format-version").isMissingNode() && !root.path("format-version").canConvertToInt()) {
      throw new SamzaException("blobsnap: index " + url(key) + " has a format-version that is not a number");
    }
    if (format > SAMZA_FORMAT) {
      throw new SamzaException("blobsnap: index " + url(key) + " is blobsnap format-version " + format
          + " (inline files or a fork's borrowed blobs), which Samza's blob-store engine cannot restore: "
          + "restore it with blobsnap, or have blobsnap write Samza's shape ([job] index-inline-below = 0, no fork)");
    }
    checkNames(root.path("snapshot-metadata"), md, "index " + url(key));
    String cp = root.path("snapshot-metadata").path("checkpoint-id").asText(null);
    if (!id.checkpointId.equals(cp)) {
      throw new SamzaException("blobsnap: index " + url(key) + " is of checkpoint " + Layout.quote(cp)
          + ", its marker names " + id.checkpointId);
    }
    try {
      out.write(bytes);
    } catch (IOException e) {
      throw new SamzaException("blobsnap: get " + url(key) + ": writing the index to Samza's stream failed", e);
    }
  }

  private ResponseInputStream<GetObjectResponse> open(String key) {
    try {
      return transport().client.getObject(GetObjectRequest.builder().bucket(settings.bucket).key(key).build());
    } catch (SdkException e) {
      throw Errors.toSamza("get " + url(key), e);
    }
  }

  // ---- helpers ----

  /** The store's scope of a request, from Samza's metadata (job, job id, task, store). */
  private String scope(Metadata md) {
    for (String[] f : new String[][] {{"job name", md.getJobName()}, {"job id", md.getJobId()},
        {"task name", md.getTaskName()}, {"store name", md.getStoreName()}}) {
      if (f[1] == null || f[1].trim().isEmpty()) {
        throw new SamzaException("blobsnap: the request's " + f[0] + " is blank (" + md + ")");
      }
    }
    return Layout.storeScope(settings.prefix, md.getJobName(), md.getJobId(), md.getTaskName(), md.getStoreName());
  }

  private static String key(String scope, String relative) {
    String key = scope + relative;
    int len = key.getBytes(java.nio.charset.StandardCharsets.UTF_8).length;
    if (len > Layout.MAX_KEY_LEN) {
      throw new SamzaException("blobsnap: key " + Layout.quote(key) + " is " + len + " bytes, over S3's "
          + Layout.MAX_KEY_LEN + " (shorten the prefix, job, task or store names)");
    }
    return key;
  }

  private String url(String key) {
    return "s3://" + settings.bucket + "/" + key;
  }

  private static JsonNode parseIndex(byte[] bytes, String what) {
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
  private static void checkNames(JsonNode meta, Metadata md, String what) {
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

  /** All of {@code in}, or null when it holds more than {@code cap} bytes. */
  private static byte[] readCapped(InputStream in, long cap) throws IOException {
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    byte[] buf = new byte[64 << 10];
    long n = 0;
    int r;
    while ((r = in.read(buf)) != -1) {
      n += r;
      if (n > cap) {
        return null;
      }
      out.write(buf, 0, r);
    }
    return out.toByteArray();
  }

  /** Close a response body: back to the pool when read to its end, aborted (connection dropped) otherwise. */
  private static void closeQuietly(ResponseInputStream<?> in, boolean drained) {
    try {
      if (!drained) {
        in.abort();
      }
      in.close();
    } catch (IOException | RuntimeException e) {
      LOG.debug("blobsnap: closing a response stream", e);
    }
  }

  static MessageDigest sha256() {
    try {
      return MessageDigest.getInstance("SHA-256");
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException("no SHA-256 in this JVM", e);
    }
  }

  static String hex(byte[] bytes) {
    char[] digits = "0123456789abcdef".toCharArray();
    StringBuilder b = new StringBuilder(bytes.length * 2);
    for (byte x : bytes) {
      b.append(digits[(x >> 4) & 0xf]).append(digits[x & 0xf]);
    }
    return b.toString();
  }

  /**
   * Run {@code op} on the I/O pool; complete the returned future on Samza's executor (on the I/O
   * thread if there is none or it is shut down) with its result, or with its failure as Samza's
   * exception type.
   */
  private <T> CompletableFuture<T> async(Callable<T> op, String what) {
    CompletableFuture<T> result = new CompletableFuture<>();
    S3Transport t;
    try {
      t = transport();
    } catch (RuntimeException e) {
      result.completeExceptionally(e);
      return result;
    }
    try {
      t.io.execute(() -> {
        T value = null;
        Throwable error = null;
        try {
          value = op.call();
        } catch (Throwable e) {
          error = e instanceof SdkException || e instanceof IOException ? Errors.toSamza(what, e)
              : e instanceof RuntimeException && (e instanceof SamzaException || e instanceof RetriableException
                  || e instanceof DeletedException) ? e
              : new SamzaException("blobsnap: " + what + ": " + e, e);
        }
        handOff(result, value, error);
      });
    } catch (RejectedExecutionException e) {
      result.completeExceptionally(new SamzaException("blobsnap: " + what + ": the S3 blob store manager is closed", e));
    }
    return result;
  }

  private <T> void handOff(CompletableFuture<T> f, T value, Throwable error) {
    Runnable complete = () -> {
      if (error != null) {
        f.completeExceptionally(error);
      } else {
        f.complete(value);
      }
    };
    if (callbacks == null) {
      complete.run();
      return;
    }
    try {
      callbacks.execute(complete);
    } catch (RejectedExecutionException e) {
      complete.run();
    }
  }

  private static <T> CompletableFuture<T> completed(T v) {
    return CompletableFuture.completedFuture(v);
  }

  private static <T> CompletableFuture<T> failed(Throwable e) {
    CompletableFuture<T> f = new CompletableFuture<>();
    f.completeExceptionally(e);
    return f;
  }
}
