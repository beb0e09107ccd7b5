package blobsnap.spike;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.File;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** A Rust tokio worker completes Java futures: values, Rust errors and panics. */
class NativeEchoTest {
  private static ExecutorService callbacks;
  private static NativeEcho echo;

  @BeforeAll
  static void load() {
    String lib = System.getProperty("blobsnap.spike.jni.lib");
    assertTrue(lib != null && new File(lib).isAbsolute() && new File(lib).isFile(),
        "system property blobsnap.spike.jni.lib must name the built cdylib (absolute path), got "
            + lib + "; build it: see docs/samza.md");
    NativeEcho.load(lib);
    callbacks = Executors.newFixedThreadPool(2, r -> {
      Thread t = new Thread(r, "spike-callbacks");
      t.setDaemon(true);
      return t;
    });
    echo = new NativeEcho(callbacks);
  }

  @AfterAll
  static void close() {
    if (echo != null) {
      echo.close();
      echo.close(); // idempotent
    }
    if (callbacks != null) {
      callbacks.shutdown();
    }
  }

  /** A future that records the thread that completes it. */
  static final class Probe extends CompletableFuture<String> {
    final AtomicReference<Thread> completer = new AtomicReference<>();

    @Override
    public boolean complete(String v) {
      completer.set(Thread.currentThread());
      return super.complete(v);
    }
  }

  @Test
  void rustCompletesTheFutureWithTheValue() throws Exception {
    // Both callback threads held until the stage is attached: the future cannot complete
    // before (a stage attached to a completed future runs on the attaching thread).
    java.util.concurrent.CountDownLatch attached = new java.util.concurrent.CountDownLatch(1);
    java.util.concurrent.CountDownLatch held = new java.util.concurrent.CountDownLatch(2);
    for (int i = 0; i < 2; i++) {
      callbacks.execute(() -> {
        held.countDown();
        try {
          attached.await();
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
        }
      });
    }
    assertTrue(held.await(10, TimeUnit.SECONDS));
    AtomicReference<String> callbackThread = new AtomicReference<>();
    CompletableFuture<String> f = echo.echo("hello, samza")
        .whenComplete((v, e) -> callbackThread.set(Thread.currentThread().getName()));
    attached.countDown();
    assertEquals("hello, samza", f.get(10, TimeUnit.SECONDS));
    assertEquals("spike-callbacks", callbackThread.get(),
        "dependent stages must run on the Java executor, not on a runtime worker");
  }

  @Test
  void theCompletingThreadIsANamedDaemonRuntimeWorker() throws Exception {
    Probe f = echo.echoInto("x", new Probe());
    assertEquals("x", f.get(10, TimeUnit.SECONDS));
    Thread completer = f.completer.get();
    assertTrue(completer.getName().startsWith("blobsnap-rt-"), completer.getName());
    assertTrue(completer.isDaemon(), "runtime workers attach as daemons");
  }

  @Test
  void aRustErrorCompletesTheFutureExceptionallyWithTheRustMessage() {
    CompletableFuture<String> f = echo.echo("fail:bucket said no");
    ExecutionException e = assertThrows(ExecutionException.class, () -> f.get(10, TimeUnit.SECONDS));
    assertInstanceOf(NativeException.class, e.getCause());
    assertEquals("echo failed: bucket said no", e.getCause().getMessage());
  }

  @Test
  void aPanicInTheTaskCompletesTheFutureExceptionally() {
    CompletableFuture<String> f = echo.echo("panic");
    ExecutionException e = assertThrows(ExecutionException.class, () -> f.get(10, TimeUnit.SECONDS));
    assertInstanceOf(NativeException.class, e.getCause());
    assertEquals("panic in native code: asked to panic", e.getCause().getMessage());
  }

  @Test
  void badArgumentsThrowSynchronously() {
    NativeException e = assertThrows(NativeException.class, () -> echo.echo(null));
    assertEquals("echoAsync: the string is null", e.getMessage());
  }

  @Test
  void aClosedHandleThrowsInsteadOfCrashing() {
    NativeEcho other = new NativeEcho(callbacks);
    other.close();
    NativeException e = assertThrows(NativeException.class, () -> other.echo("late"));
    assertEquals("native handle is null (closed or never opened)", e.getMessage());
  }

  @Test
  void manyCallsInFlightAllComplete() throws Exception {
    List<CompletableFuture<String>> fs = new ArrayList<>();
    for (int i = 0; i < 5000; i++) {
      fs.add(echo.echo("n" + i));
    }
    CompletableFuture.allOf(fs.toArray(new CompletableFuture<?>[0])).get(60, TimeUnit.SECONDS);
    for (int i = 0; i < fs.size(); i++) {
      assertEquals("n" + i, fs.get(i).get());
    }
    assertFalse(fs.isEmpty());
  }
}
