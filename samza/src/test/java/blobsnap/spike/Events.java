package blobsnap.spike;

import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Paths;
import org.apache.samza.config.Config;

/**
 * What the spike job did, one line per event, appended to {@code <spike.work.dir>/events.txt}.
 * Each line is one write(2): it survives a SIGKILL of the job's JVM.
 */
final class Events {
  static final String WORK_DIR = "spike.work.dir";

  private Events() {}

  static synchronized void log(Config config, String line) {
    String dir = config.get(WORK_DIR);
    if (dir == null) {
      throw new IllegalStateException("config " + WORK_DIR + " is not set");
    }
    try (OutputStream out = new FileOutputStream(Paths.get(dir, "events.txt").toFile(), true)) {
      out.write((line + "\n").getBytes(StandardCharsets.UTF_8));
    } catch (IOException e) {
      throw new IllegalStateException("cannot append to events.txt in " + dir, e);
    }
  }
}
