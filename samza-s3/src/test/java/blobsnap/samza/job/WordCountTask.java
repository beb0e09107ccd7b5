package blobsnap.samza.job;

import java.io.IOException;
import java.io.Writer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.Map;
import java.util.TreeMap;
import org.apache.samza.config.Config;
import org.apache.samza.context.Context;
import org.apache.samza.storage.kv.Entry;
import org.apache.samza.storage.kv.KeyValueIterator;
import org.apache.samza.storage.kv.KeyValueStore;
import org.apache.samza.system.IncomingMessageEnvelope;
import org.apache.samza.task.EndOfStreamListenerTask;
import org.apache.samza.task.InitableTask;
import org.apache.samza.task.MessageCollector;
import org.apache.samza.task.StreamTask;
import org.apache.samza.task.TaskCoordinator;

/**
 * The tests' word count (both routes: samza/ runs it too): words, and lines under
 * {@link #LINES}, counted in the RocksDB store {@code counts}. At init it logs how many lines
 * the (restored) store holds; at end of stream it asks for a commit and writes the whole store
 * to {@code <wordcount.work.dir>/counts.txt}.
 */
public class WordCountTask implements StreamTask, InitableTask, EndOfStreamListenerTask {
  public static final String LINES = "__lines__";
  public static final String COUNTS_FILE = "counts.txt";

  private KeyValueStore<String, Integer> counts;
  private Config config;

  @Override
  @SuppressWarnings("unchecked")
  public void init(Context context) {
    counts = (KeyValueStore<String, Integer>) context.getTaskContext().getStore("counts");
    config = context.getJobContext().getConfig();
    Integer lines = counts.get(LINES);
    Events.log(config, "task.init " + context.getTaskContext().getTaskModel().getTaskName() + " lines-in-store="
        + (lines == null ? 0 : lines));
  }

  @Override
  public void process(IncomingMessageEnvelope envelope, MessageCollector collector, TaskCoordinator coordinator) {
    String line = (String) envelope.getMessage();
    for (String word : line.split("\\s+")) {
      if (!word.isEmpty()) {
        Integer n = counts.get(word);
        counts.put(word, n == null ? 1 : n + 1);
      }
    }
    Integer n = counts.get(LINES);
    counts.put(LINES, n == null ? 1 : n + 1);
  }

  @Override
  public void onEndOfStream(MessageCollector collector, TaskCoordinator coordinator) {
    // Samza 1.8 does not commit at shutdown by itself (and this commit may lose its checkpoint
    // write to the shutdown: docs/samza.md); the test does not depend on it.
    coordinator.commit(TaskCoordinator.RequestScope.CURRENT_TASK);
    Map<String, Integer> all = new TreeMap<>();
    KeyValueIterator<String, Integer> it = counts.all();
    try {
      while (it.hasNext()) {
        Entry<String, Integer> e = it.next();
        all.put(e.getKey(), e.getValue());
      }
    } finally {
      it.close();
    }
    try (Writer w = Files.newBufferedWriter(Paths.get(config.get(Events.WORK_DIR), COUNTS_FILE),
        StandardCharsets.UTF_8)) {
      for (Map.Entry<String, Integer> e : all.entrySet()) {
        w.write(e.getKey() + " " + e.getValue() + "\n");
      }
    } catch (IOException e) {
      throw new IllegalStateException("cannot write " + COUNTS_FILE, e);
    }
    Events.log(config, "task.endOfStream lines-in-store=" + all.get(LINES));
  }
}
