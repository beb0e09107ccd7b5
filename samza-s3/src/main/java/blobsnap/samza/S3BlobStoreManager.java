package blobsnap.samza;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
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
import software.amazon.awssdk.core.exception.SdkException;
import software.amazon.awssdk.core.sync.RequestBody;

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
 *       {@code "engine": "samza-blob-store"} and {@code "history": "prepared"} ({@link OwnerRecord}).
 *       A record already there
 *       must name that engine: a scope of a blobsnap deployment (or anything else) fails the put
 *       with a {@link SamzaException}, because the two engines' collectors would delete each
 *       other's blobs.</li>
 *   <li><b>get</b> streams the object into Samza's stream and checks its SHA-256 against the id
 *       (both shapes are content-addressed); an index must also be one Samza's reader can use
 *       (blobsnap {@code format-version} 1) and name this job, task and store.</li>
 *   <li><b>delete</b> is deferred to blobsnap's garbage collection: a no-op that logs (see
 *       README.md: immediate deletes would keep one point of history only).</li>
 *   <li><b>history</b> ({@link History}): the put of an index also writes its <em>prepared</em>
 *       record, a root for blobsnap's sweep; {@code removeTTL} of the index (Samza's cleanUp, after
 *       its checkpoint write; S3 objects have no TTL) commits the checkpoint into blobsnap's history
 *       ({@link #onIndexCommitted}), so that {@code blobsnap gc}, {@code checkpoints}, {@code check},
 *       savepoints and restores work on the job.</li>
 * </ul>
 *
 * <p>Every call returns at once: the S3 requests run on a bounded pool shared by the process
 * ({@link S3Transport}), and each returned future is completed on the executor Samza gave the
 * factory, so Samza's dependent stages never run on an I/O thread and nothing blocks Samza's
 * run loop. Failures are Samza's exception types ({@link Errors}): a missing key is a
 * {@link DeletedException}; 5xx, throttling, timeouts and I/O errors are
 * {@link RetriableException}s (Samza retries them); the rest are {@link SamzaException}s naming
 * the key.
 *
 * <p>This class is Samza's calls and the keys they map to; the parts they share live beside it:
 * the create-only PUT ({@link CreateOnlyPut}), the owner record ({@link OwnerRecord}), the reads
 * ({@link ObjectReader}) and the checks of an index's JSON ({@link SnapshotIndexes}).
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

  private final S3Settings settings;
  private final ExecutorService callbacks;
  private final AwsCredentialsProvider credentials;
  private final Object lock = new Object();
  private S3Transport transport;
  private final AtomicBoolean closed = new AtomicBoolean();
  private final AtomicBoolean deleteLogged = new AtomicBoolean();
  private final AtomicLong deferredDeletes = new AtomicLong();
  private final ObjectReader reader;
  private final CreateOnlyPut puts;
  private final OwnerRecord ownerRecord;
  private final History history;

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
    this.reader = new ObjectReader(settings, this::transport);
    this.puts = new CreateOnlyPut(settings, this::transport, reader);
    this.ownerRecord = new OwnerRecord(settings, this::transport, reader, puts);
    this.history = new History(settings, this::transport, reader, puts, ownerRecord);
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
        reader.readBlob(key, parsed, outputStream);
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
   * Hook: the index {@code committed} belongs to a checkpoint Samza has committed. Commits the
   * checkpoint into blobsnap's history once every store of it is in ({@link History}); the
   * crash point {@code samza.before-cleanup} ({@link CrashPoint}) kills the JVM right before.
   *
   * @return a future completed when the history record is durable
   */
  protected CompletionStage<Void> onIndexCommitted(CommittedIndex committed) {
    return async(() -> {
      CrashPoint.reach("samza.before-cleanup");
      history.committed(committed.metadata, committed.checkpointId, committed.marker);
      return null;
    }, "commit checkpoint " + committed.checkpointId + " into blobsnap's history");
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
    ownerRecord.ensure(md);
    puts.put(key, RequestBody.fromFile(path), n, digest, path.toString());
    LOG.debug("blobsnap: {} -> s3://{}/{}", path, settings.bucket, key);
    return blobId;
  }

  private String putIndex(InputStream in, Metadata md, String scope) {
    byte[] bytes;
    try {
      bytes = ObjectReader.readCapped(in, MAX_INDEX_BYTES);
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
    JsonNode meta = SnapshotIndexes.parse(bytes, "the snapshot index to upload").path("snapshot-metadata");
    SnapshotIndexes.checkNames(meta, md, "the snapshot index to upload");
    String checkpointId = meta.path("checkpoint-id").asText(null);
    byte[] digest = sha256().digest(bytes);
    String marker = Layout.marker(checkpointId, hex(digest));
    String key = key(scope, marker);
    ownerRecord.ensure(md);
    puts.put(key, RequestBody.fromBytes(bytes), bytes.length, digest, "the snapshot index");
    // A root for blobsnap's sweep from here on, until Samza's cleanUp commits it (removeTTL).
    history.prepare(md, checkpointId, marker);
    LOG.info("blobsnap: index of task {} store {} at checkpoint {}: s3://{}/{}", md.getTaskName(), md.getStoreName(),
        checkpointId, settings.bucket, key);
    return marker;
  }

  // ---- get ----

  /** The index at {@code key}: its bytes checked against the marker, its JSON checked for Samza's reader. */
  private void getIndex(String key, Layout.ParsedId id, OutputStream out, Metadata md) {
    byte[] bytes = reader.readIndex(key, id);
    SnapshotIndexes.checkRestorable(bytes, reader.url(key), id, md);
    try {
      out.write(bytes);
    } catch (IOException e) {
      throw new SamzaException("blobsnap: get " + reader.url(key) + ": writing the index to Samza's stream failed", e);
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

  /** {@code scope + relative}, refused when over S3's key length. */
  static String key(String scope, String relative) {
    String key = scope + relative;
    int len = key.getBytes(java.nio.charset.StandardCharsets.UTF_8).length;
    if (len > Layout.MAX_KEY_LEN) {
      throw new SamzaException("blobsnap: key " + Layout.quote(key) + " is " + len + " bytes, over S3's "
          + Layout.MAX_KEY_LEN + " (shorten the prefix, job, task or store names)");
    }
    return key;
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
