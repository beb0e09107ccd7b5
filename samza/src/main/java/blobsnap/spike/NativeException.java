package blobsnap.spike;

/** An error from the spike's native library, with the Rust message. */
public class NativeException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  public NativeException(String message) {
    super(message);
  }
}
