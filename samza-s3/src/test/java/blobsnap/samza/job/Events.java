package blobsnap.samza.job;

import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Paths;
import org.apache.samza.config.Config;

/**
 * What the word-count job did, one line per event, appended to {@code <wordcount.work.dir>/events.txt}
 * (route 1's tests in samza/ run this job too). Each line is one write(2): it survives a SIGKILL of
 * the job's JVM, and the test waits on it.
 */
public final class Events {
  public static final String WORK_DIR = "wordcount.work.dir";
  public static final String FILE = "events.txt";

  private Events() {}

  public static synchronized void log(Config config, String line) {
    String dir = config.get(WORK_DIR);
    if (dir == null) {
      throw new IllegalStateException("config " + WORK_DIR + " is not set");
    }
    try (OutputStream out = new FileOutputStream(Paths.get(dir, FILE).toFile(), true)) {
      out.write((line + "\n").getBytes(StandardCharsets.UTF_8));
    } catch (IOException e) {
      throw new IllegalStateException("cannot append to " + FILE + " in " + dir, e);
    }
  }
}
