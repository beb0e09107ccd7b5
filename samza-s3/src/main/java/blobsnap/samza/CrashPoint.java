package blobsnap.samza;

import java.io.IOException;
import java.lang.management.ManagementFactory;
import java.util.concurrent.atomic.AtomicLong;

/**
 * blobsnap's crash points (the Rust {@code crash} module), for the tests of what a kill at a
 * named step leaves: with {@code BLOBSNAP_CRASH_AT=<point>[@N]} in the environment, the N-th time
 * (default 1) the point is reached the JVM is killed with SIGKILL — no shutdown hook, no
 * {@code finally}. Unset (always, in production), a point costs one read of a cached value.
 * Points: {@code samza.before-cleanup} (Samza wrote its checkpoint and removes the TTL of an
 * index, before this manager commits the checkpoint into blobsnap's history).
 */
final class CrashPoint {
  private static final String SPEC = System.getenv("BLOBSNAP_CRASH_AT");
  private static final AtomicLong REACHED = new AtomicLong();

  private CrashPoint() {}

  static void reach(String point) {
    if (SPEC == null || SPEC.isEmpty()) {
      return;
    }
    int at = SPEC.indexOf('@');
    String name = at < 0 ? SPEC : SPEC.substring(0, at);
    if (!name.equals(point)) {
      return;
    }
    long n;
    try {
      n = at < 0 ? 1 : Long.parseLong(SPEC.substring(at + 1));
    } catch (NumberFormatException e) {
      throw new IllegalArgumentException("BLOBSNAP_CRASH_AT=" + SPEC + ": the hit after '@' is not a number", e);
    }
    if (REACHED.incrementAndGet() != n) {
      return;
    }
    String jvm = ManagementFactory.getRuntimeMXBean().getName();
    String pid = jvm.substring(0, Math.max(0, jvm.indexOf('@')));
    System.err.println("blobsnap: crash point " + point + " reached: SIGKILL");
    try {
      new ProcessBuilder("kill", "-KILL", pid).inheritIO().start().waitFor();
      Thread.sleep(60_000);
    } catch (IOException | InterruptedException e) {
      Runtime.getRuntime().halt(137);
    }
    Runtime.getRuntime().halt(137);
  }
}
