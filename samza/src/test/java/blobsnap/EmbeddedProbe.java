package blobsnap;

import java.util.HashMap;
import java.util.Map;
import org.apache.samza.config.MapConfig;

/**
 * Run in a JVM of its own by {@link EmbeddedLibraryTest}, with no {@code blobsnap.native.lib}:
 * the library must come from the classpath resource the jar carries. Prints one line and exits
 * 0 when it opened an engine and got blobsnap's classified error for a typo.
 */
public final class EmbeddedProbe {
  private EmbeddedProbe() {}

  public static void main(String[] args) {
    if (System.getProperty(Native.LIB_PROPERTY) != null) {
      System.err.println("probe: " + Native.LIB_PROPERTY + " is set: this would not test the embedded library");
      System.exit(2);
    }
    Map<String, String> c = new HashMap<>();
    c.put("job.name", "probe");
    c.put("blobsnap.store.kind", "local");
    c.put("blobsnap.store.local-dir", args[0]);
    Engine engine = Engine.open(new MapConfig(c));
    Native.close(engine.handle);
    c.put("blobsnap.store.lokal-dir", args[0]);
    try {
      Engine.open(new MapConfig(c));
      System.err.println("probe: a typo was accepted");
      System.exit(1);
    } catch (BlobsnapException e) {
      System.out.println("embedded library loaded; a typo: " + e.kind() + ": " + e.getMessage());
    }
  }
}
