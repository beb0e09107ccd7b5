package blobsnap.spike;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executor;

/**
 * Spike of issue 50: a native handle whose async call is completed by a Rust tokio worker.
 *
 * <p>The Rust side ({@code samza/spike-jni}) owns a runtime of two workers; {@link #echo} hands
 * it a fresh {@link CompletableFuture} that a worker completes (attached to the JVM as a daemon
 * thread named {@code blobsnap-rt}). The future returned to the caller is completed from
 * {@code callbacks}, so the caller's dependent stages never run on a runtime worker.
 */
public final class NativeEcho implements AutoCloseable {
  private static native long runtimeNew();

  private static native void runtimeClose(long handle);

  private static native void echoAsync(long handle, String s, CompletableFuture<String> future);

  private final Executor callbacks;
  private volatile long handle;

  /** Loads the native library from an absolute path (the plug-in will extract it from its jar). */
  public static void load(String absolutePath) {
    System.load(absolutePath);
  }

  public NativeEcho(Executor callbacks) {
    this.callbacks = callbacks;
    this.handle = runtimeNew();
  }

  /**
   * Echoes {@code s} asynchronously; {@code "fail:MSG"} completes exceptionally with a
   * {@link NativeException} carrying the Rust message, {@code "panic"} panics on the Rust side.
   */
  public CompletableFuture<String> echo(String s) {
    CompletableFuture<String> raw = echoRaw(s);
    CompletableFuture<String> out = new CompletableFuture<>();
    raw.whenCompleteAsync(
        (v, e) -> {
          if (e != null) {
            out.completeExceptionally(e);
          } else {
            out.complete(v);
          }
        },
        callbacks);
    return out;
  }

  /** The future as the Rust worker completes it (its inline stages run on that worker). */
  CompletableFuture<String> echoRaw(String s) {
    return echoInto(s, new CompletableFuture<>());
  }

  /** {@link #echoRaw} into a future the caller made (a test's probe). */
  <F extends CompletableFuture<String>> F echoInto(String s, F raw) {
    echoAsync(handle, s, raw); // a closed handle is 0: Rust throws NativeException
    return raw;
  }

  /** Stops the runtime (waits up to 10 s for its tasks); idempotent. */
  @Override
  public synchronized void close() {
    long h = handle;
    handle = 0;
    if (h != 0) {
      runtimeClose(h);
    }
  }
}
