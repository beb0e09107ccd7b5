package blobsnap;

import org.apache.samza.SamzaException;

/**
 * A failure of blobsnap's engine, with blobsnap's error kind ({@code not-found}, {@code corrupt},
 * {@code invalid-input}, {@code transient}, {@code permanent}, {@code conflict}, {@code io},
 * {@code cancelled}) and its message. Transient failures reach Samza as its
 * {@link org.apache.samza.storage.blobstore.exceptions.RetriableException} (with this as the
 * cause); the rest as this.
 */
public class BlobsnapException extends SamzaException {
  private static final long serialVersionUID = 1L;

  private final String kind;

  /** Made by the native library (its constructor signature is part of the JNI contract). */
  public BlobsnapException(String kind, String message) {
    super("blobsnap: " + message);
    this.kind = kind;
  }

  /** blobsnap's error kind, e.g. {@code transient}. */
  public String kind() {
    return kind;
  }

  /** Whether retrying may succeed. */
  public boolean retriable() {
    return "transient".equals(kind);
  }
}
