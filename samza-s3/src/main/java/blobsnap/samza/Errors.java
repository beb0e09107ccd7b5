package blobsnap.samza;

import java.io.IOException;
import java.io.UncheckedIOException;
import org.apache.samza.SamzaException;
import org.apache.samza.storage.blobstore.exceptions.DeletedException;
import org.apache.samza.storage.blobstore.exceptions.RetriableException;
import software.amazon.awssdk.core.exception.ApiCallAttemptTimeoutException;
import software.amazon.awssdk.core.exception.ApiCallTimeoutException;
import software.amazon.awssdk.core.exception.SdkClientException;
import software.amazon.awssdk.core.exception.SdkException;
import software.amazon.awssdk.awscore.exception.AwsServiceException;

/**
 * What an S3 failure means to Samza's blob-store engine, which decides by exception type alone
 * (reference §6.1: after unwrapping {@code CompletionException}s, only a
 * {@link RetriableException} is retried, for up to 15 minutes; a {@link DeletedException} drives
 * its "deleted blob" paths; anything else fails the commit or the restore at once).
 *
 * <p>The classes follow blobsnap's Rust {@code kind_of_status} (DESIGN §9): 404 / NoSuchKey →
 * deleted; 5xx, 503 SlowDown, 408, 409, 429, timeouts, connection failures and other I/O →
 * retriable; 403, a missing bucket, a wrong region, 501 and the rest → plain
 * {@link SamzaException}. Every message names the operation and the key.
 */
final class Errors {
  private Errors() {
  }

  /** The kind of an S3 error response: by error code first, then HTTP status. */
  enum Kind {
    NOT_FOUND, CONFLICT, TRANSIENT, CORRUPT, PERMANENT
  }

  static Kind kindOf(int status, String code) {
    if (code != null) {
      switch (code) {
        case "NoSuchKey":
        case "NoSuchUpload":
          return Kind.NOT_FOUND;
        case "NoSuchBucket":
        case "AccessDenied":
        case "InvalidAccessKeyId":
        case "SignatureDoesNotMatch":
        case "PermanentRedirect":
        case "AuthorizationHeaderMalformed":
        case "NotImplemented":
          return Kind.PERMANENT;
        case "PreconditionFailed":
          return Kind.CONFLICT;
        case "BadDigest":
        case "InvalidDigest":
        case "XAmzContentSHA256Mismatch":
        case "XAmzContentChecksumMismatch":
          return Kind.CORRUPT;
        case "SlowDown":
        case "RequestTimeout":
        case "InternalError":
        case "ServiceUnavailable":
        case "ConditionalRequestConflict":
        case "RequestTimeTooSkewed":
        case "OperationAborted":
          return Kind.TRANSIENT;
        default:
          break;
      }
    }
    if (status == 404) {
      return Kind.NOT_FOUND;
    }
    if (status == 501) {
      return Kind.PERMANENT;
    }
    if (status == 412) {
      return Kind.CONFLICT;
    }
    if (status == 408 || status == 409 || status == 429 || (status >= 500 && status <= 599)) {
      return Kind.TRANSIENT;
    }
    return Kind.PERMANENT;
  }

  /** The kind of any failure of a request (responses by {@link #kindOf}, the rest by type). */
  static Kind kindOf(Throwable t) {
    if (t instanceof AwsServiceException) {
      AwsServiceException s = (AwsServiceException) t;
      String code = s.awsErrorDetails() != null ? s.awsErrorDetails().errorCode() : null;
      return kindOf(s.statusCode(), code);
    }
    if (t instanceof ApiCallAttemptTimeoutException || t instanceof ApiCallTimeoutException) {
      return Kind.TRANSIENT;
    }
    if (t instanceof IOException || t instanceof UncheckedIOException) {
      return Kind.TRANSIENT;
    }
    if (t instanceof SdkClientException) {
      // No response: transient when the cause is the network (refused, reset, timed out, DNS);
      // a setup problem otherwise (credentials, region, a bad endpoint URL).
      for (Throwable c = t.getCause(); c != null; c = c.getCause()) {
        if (c instanceof javax.net.ssl.SSLHandshakeException || c instanceof java.security.cert.CertificateException) {
          // The server's certificate is not trusted: a setting to fix, not a hiccup to retry.
          return Kind.PERMANENT;
        }
      }
      for (Throwable c = t.getCause(); c != null; c = c.getCause()) {
        if (c instanceof IOException) {
          return Kind.TRANSIENT;
        }
      }
      String m = String.valueOf(t.getMessage());
      if (m.contains("Unable to execute HTTP request") || m.contains("timed out") || m.contains("Connection reset")) {
        return Kind.TRANSIENT;
      }
      return Kind.PERMANENT;
    }
    return Kind.PERMANENT;
  }

  /** Samza's exception for a failure of {@code what} (an operation and an s3:// URL). */
  static RuntimeException toSamza(String what, Throwable t) {
    if (t instanceof SamzaException || t instanceof RetriableException || t instanceof DeletedException) {
      return (RuntimeException) t;
    }
    Kind kind = kindOf(t);
    String text = describe(what, t);
    switch (kind) {
      case NOT_FOUND:
        return new DeletedException(text + ": no such object", t);
      case TRANSIENT:
        return new RetriableException(text, t);
      default:
        return new SamzaException(text, t);
    }
  }

  static String describe(String what, Throwable t) {
    StringBuilder b = new StringBuilder("blobsnap: ").append(what).append(": ");
    if (t instanceof AwsServiceException) {
      AwsServiceException s = (AwsServiceException) t;
      String code = s.awsErrorDetails() != null ? s.awsErrorDetails().errorCode() : null;
      String msg = s.awsErrorDetails() != null ? s.awsErrorDetails().errorMessage() : null;
      b.append("HTTP ").append(s.statusCode());
      if (code != null) {
        b.append(' ').append(code);
      }
      if (msg != null) {
        b.append(" (").append(msg).append(')');
      }
      if ("NoSuchBucket".equals(code)) {
        b.append(": the bucket does not exist");
      } else if (s.statusCode() == 403) {
        b.append(": access denied (credentials, bucket policy; on AWS a missing key also gives 403 without s3:ListBucket)");
      } else if (s.statusCode() == 301 || "PermanentRedirect".equals(code) || "AuthorizationHeaderMalformed".equals(code)) {
        b.append(": wrong region for this bucket?");
      } else if (s.statusCode() == 501 || "NotImplemented".equals(code)) {
        b.append(": not implemented by this server (for If-None-Match on PUT set " + S3Settings.CREATE_ONLY + "=ignored)");
      }
    } else if (t instanceof SdkException || t instanceof IOException || t instanceof UncheckedIOException) {
      b.append(t.getClass().getSimpleName()).append(": ").append(t.getMessage());
    } else {
      b.append(t);
    }
    return b.toString();
  }
}
