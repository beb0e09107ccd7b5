package blobsnap.samza;

import java.security.MessageDigest;
import java.util.Base64;
import java.util.function.Supplier;
import org.apache.samza.SamzaException;
import org.apache.samza.storage.blobstore.exceptions.RetriableException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import software.amazon.awssdk.core.exception.SdkException;
import software.amazon.awssdk.core.sync.RequestBody;
import software.amazon.awssdk.services.s3.model.HeadObjectResponse;
import software.amazon.awssdk.services.s3.model.PutObjectRequest;
import software.amazon.awssdk.services.s3.model.S3Exception;

/**
 * The create-only PUT every object of {@link S3BlobStoreManager} is written with: sent with
 * {@code If-None-Match: *} and {@code x-amz-checksum-sha256} (or after a HEAD, when the server
 * ignores the header: {@code create-only = ignored}), never overwriting. An object already
 * under the key, or found there when the PUT's outcome is unclear (a 412, a reset, a timeout,
 * a 5xx: settled by reading back), must pass an {@link ExistingCheck}: by default the same size
 * and SHA-256, since blob and index keys name the hash of their bytes. A PUT that got no
 * response at all is sent once more on a fresh connection; every other retry is Samza's.
 *
 * <p>Logs under the manager's logger name.
 */
final class CreateOnlyPut {
  private static final Logger LOG = LoggerFactory.getLogger(S3BlobStoreManager.class);

  /** What an object found under a create-only key must be for the PUT to count as done. */
  interface ExistingCheck {
    /** Returns when the object at {@code key} will do; throws (Samza's exception types) if not. */
    void check(String key, HeadObjectResponse existing);
  }

  private final S3Settings settings;
  private final Supplier<S3Transport> transport;
  private final ObjectReader reader;

  /**
   * @param settings the bucket and the create-only mode
   * @param transport the manager's shared transport (throws once the manager is closed)
   * @param reader the HEADs and read-backs that settle a PUT
   */
  CreateOnlyPut(S3Settings settings, Supplier<S3Transport> transport, ObjectReader reader) {
    this.settings = settings;
    this.transport = transport;
    this.reader = reader;
  }

  /**
   * PUT {@code body} ({@code len} bytes, SHA-256 {@code digest}) at {@code key} unless it exists;
   * an object already there must have the same size and SHA-256 (its key is their hash).
   */
  void put(String key, RequestBody body, long len, byte[] digest, String what) {
    put(key, body, len, digest, what, (k, existing) -> verifyExisting(k, existing, len, digest));
  }

  /**
   * PUT {@code body} at {@code key} unless it exists (If-None-Match: *, or a HEAD first when the
   * server ignores it); an object already there, or one found there when the PUT's outcome is
   * unclear, must pass {@code ifExists}.
   */
  void put(String key, RequestBody body, long len, byte[] digest, String what, ExistingCheck ifExists) {
    S3Transport t = transport.get();
    if (!settings.createOnly.sendsHeader()) {
      // The server ignores If-None-Match (Garage): look first, so that a blob is never written
      // twice (its last-modified is what blobsnap's sweep judges its age by).
      HeadObjectResponse existing = reader.head(key);
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
          HeadObjectResponse existing = reader.head(key);
          if (existing == null) {
            throw new RetriableException("blobsnap: put " + reader.url(key) + ": 412 (exists), then not found: retry",
                e);
          }
          ifExists.check(key, existing);
          LOG.debug("blobsnap: {} is already stored as {}", what, reader.url(key));
          return;
        }
        if (kind == Errors.Kind.CORRUPT) {
          // Each attempt re-reads and re-hashes what it sends: a retry uploads what the file holds then.
          throw new RetriableException(Errors.describe("put " + reader.url(key), e)
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
          LOG.debug("blobsnap: put {} got no response ({}); once more on a fresh connection", reader.url(key),
              e.toString());
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
    RuntimeException original = Errors.toSamza("put " + reader.url(key), e);
    if (!(original instanceof RetriableException)) {
      return original;
    }
    HeadObjectResponse existing;
    try {
      existing = reader.head(key);
    } catch (RuntimeException headFailed) {
      original.addSuppressed(headFailed);
      return original;
    }
    if (existing == null) {
      return original;
    }
    ifExists.check(key, existing);
    LOG.debug("blobsnap: put {} failed ({}), but the object is there and will do", reader.url(key), e.toString());
    return null;
  }

  /** Whether the object at {@code key} has {@code len} bytes with SHA-256 {@code digest}; throws if not. */
  private void verifyExisting(String key, HeadObjectResponse head, long len, byte[] digest) {
    Long size = head.contentLength();
    if (size != null && size != len) {
      throw new SamzaException("blobsnap: " + reader.url(key) + " exists with " + size + " bytes, not " + len
          + ": an object of another writer under a content-addressed key; not overwritten");
    }
    String stored = head.checksumSHA256();
    byte[] actual;
    if (stored != null && !stored.contains("-")) {
      actual = Base64.getDecoder().decode(stored);
    } else {
      actual = reader.hashObject(key);
    }
    if (!MessageDigest.isEqual(actual, digest)) {
      throw new SamzaException("blobsnap: " + reader.url(key) + " exists with other bytes (SHA-256 "
          + S3BlobStoreManager.hex(actual) + "): an object of another writer under a content-addressed key; "
          + "not overwritten");
    }
  }
}
