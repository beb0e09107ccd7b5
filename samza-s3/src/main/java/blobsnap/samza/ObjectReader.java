package blobsnap.samza;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.security.MessageDigest;
import java.util.function.Supplier;
import org.apache.samza.SamzaException;
import org.apache.samza.storage.blobstore.exceptions.RetriableException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import software.amazon.awssdk.core.ResponseInputStream;
import software.amazon.awssdk.core.exception.SdkException;
import software.amazon.awssdk.services.s3.model.ChecksumMode;
import software.amazon.awssdk.services.s3.model.GetObjectRequest;
import software.amazon.awssdk.services.s3.model.GetObjectResponse;
import software.amazon.awssdk.services.s3.model.HeadObjectRequest;
import software.amazon.awssdk.services.s3.model.HeadObjectResponse;

/**
 * The reads of {@link S3BlobStoreManager} from its bucket: HEAD, GET, and a GET's body read to
 * its end and checked against the object's content address (a blob's bytes or an index's
 * exact bytes hash to the SHA-256 its id names). Failures are Samza's exception types
 * ({@link Errors}), each message naming the key. A response body is handed back to the
 * connection pool only when read to its end, and aborted otherwise.
 *
 * <p>The transport is asked for on every call, so that a call on a closed manager fails as
 * such. Logs under the manager's logger name.
 */
final class ObjectReader {
  private static final Logger LOG = LoggerFactory.getLogger(S3BlobStoreManager.class);

  private final S3Settings settings;
  private final Supplier<S3Transport> transport;

  /**
   * @param settings the bucket
   * @param transport the manager's shared transport (throws once the manager is closed)
   */
  ObjectReader(S3Settings settings, Supplier<S3Transport> transport) {
    this.settings = settings;
    this.transport = transport;
  }

  /** {@code s3://<bucket>/<key>}, for messages. */
  String url(String key) {
    return "s3://" + settings.bucket + "/" + key;
  }

  /** The object's metadata (with its stored SHA-256 when it has one), or null when there is none. */
  HeadObjectResponse head(String key) {
    HeadObjectRequest req = HeadObjectRequest.builder()
        .bucket(settings.bucket).key(key).checksumMode(ChecksumMode.ENABLED).build();
    for (int attempt = 1; ; attempt++) {
      try {
        return transport.get().client.headObject(req);
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

  /** A GET of {@code key}, its body not yet read: close it with {@link #closeQuietly}. */
  ResponseInputStream<GetObjectResponse> open(String key) {
    try {
      return transport.get().client.getObject(GetObjectRequest.builder().bucket(settings.bucket).key(key).build());
    } catch (SdkException e) {
      throw Errors.toSamza("get " + url(key), e);
    }
  }

  /** The SHA-256 of the object at {@code key}, read back in full. */
  byte[] hashObject(String key) {
    MessageDigest sha = S3BlobStoreManager.sha256();
    try (ResponseInputStream<GetObjectResponse> in = transport.get().client.getObject(
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

  /**
   * Stream the blob at {@code key} into {@code out}, then check its length against the
   * response's and its SHA-256 against the one {@code id} names.
   */
  void readBlob(String key, Layout.ParsedId id, OutputStream out) {
    MessageDigest sha = S3BlobStoreManager.sha256();
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
    String got = S3BlobStoreManager.hex(sha.digest());
    if (!got.equals(id.sha256)) {
      throw new SamzaException("blobsnap: get " + url(key) + ": corrupt: its " + n + " bytes have SHA-256 " + got
          + ", its key names " + id.sha256);
    }
  }

  /**
   * The bytes of the index at {@code key}, at most {@link S3BlobStoreManager#MAX_INDEX_BYTES},
   * checked against the SHA-256 its marker {@code id} names (its content is not looked at here:
   * {@link SnapshotIndexes#checkRestorable}).
   */
  byte[] readIndex(String key, Layout.ParsedId id) {
    long cap = S3BlobStoreManager.MAX_INDEX_BYTES;
    byte[] bytes;
    ResponseInputStream<GetObjectResponse> in = open(key);
    boolean drained = false;
    try {
      Long len = in.response().contentLength();
      if (len != null && len > cap) {
        throw new SamzaException("blobsnap: index " + url(key) + " is " + len + " bytes, over the "
            + cap + "-byte cap");
      }
      bytes = readCapped(in, cap);
      drained = bytes != null;
    } catch (IOException e) {
      throw Errors.toSamza("get " + url(key), e);
    } finally {
      closeQuietly(in, drained);
    }
    if (bytes == null) {
      throw new SamzaException("blobsnap: index " + url(key) + " is over the " + cap + "-byte cap");
    }
    String got = S3BlobStoreManager.hex(S3BlobStoreManager.sha256().digest(bytes));
    if (!got.equals(id.sha256)) {
      throw new SamzaException("blobsnap: get " + url(key) + ": corrupt: the index's bytes have SHA-256 " + got
          + ", its marker names " + id.sha256);
    }
    return bytes;
  }

  /** All of {@code in}, or null when it holds more than {@code cap} bytes. */
  static byte[] readCapped(InputStream in, long cap) throws IOException {
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
  static void closeQuietly(ResponseInputStream<?> in, boolean drained) {
    try {
      if (!drained) {
        in.abort();
      }
      in.close();
    } catch (IOException | RuntimeException e) {
      LOG.debug("blobsnap: closing a response stream", e);
    }
  }
}
