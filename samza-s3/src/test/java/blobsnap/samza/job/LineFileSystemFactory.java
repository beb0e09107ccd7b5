package blobsnap.samza.job;

import java.io.BufferedReader;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.Collections;
import java.util.HashMap;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.stream.Stream;
import org.apache.samza.Partition;
import org.apache.samza.config.Config;
import org.apache.samza.metrics.MetricsRegistry;
import org.apache.samza.system.IncomingMessageEnvelope;
import org.apache.samza.system.OutgoingMessageEnvelope;
import org.apache.samza.system.SystemAdmin;
import org.apache.samza.system.SystemConsumer;
import org.apache.samza.system.SystemFactory;
import org.apache.samza.system.SystemProducer;
import org.apache.samza.system.SystemStreamMetadata;
import org.apache.samza.system.SystemStreamMetadata.SystemStreamPartitionMetadata;
import org.apache.samza.system.SystemStreamPartition;
import org.apache.samza.util.BlockingEnvelopeMap;

/**
 * A durable input (route 1's tests in samza/ use it too): every stream of the system is the file
 * {@code systems.<system>.path}, one partition, one message per line, the offset of a line its
 * number (from 0). A restarted job re-reads the file from the offset after its checkpoint.
 *
 * <p>{@code systems.<system>.delay.ms} paces the lines (so a test can kill the job half way);
 * {@code systems.<system>.end.of.stream=true} sends end-of-stream after the last line.
 */
@SuppressWarnings("deprecation") // Samza 1.8.0 deprecates the String-named SystemFactory methods it still calls
public class LineFileSystemFactory implements SystemFactory {
  @Override
  public SystemConsumer getConsumer(String systemName, Config config, MetricsRegistry registry) {
    return new Consumer(systemName, config, registry);
  }

  @Override
  public SystemProducer getProducer(String systemName, Config config, MetricsRegistry registry) {
    return new SystemProducer() {
      @Override
      public void start() {}

      @Override
      public void stop() {}

      @Override
      public void register(String source) {}

      @Override
      public void send(String source, OutgoingMessageEnvelope envelope) {
        throw new UnsupportedOperationException("the line-file system is input only");
      }

      @Override
      public void flush(String source) {}
    };
  }

  @Override
  public SystemAdmin getAdmin(String systemName, Config config) {
    return new Admin(path(systemName, config));
  }

  static String path(String systemName, Config config) {
    String key = "systems." + systemName + ".path";
    String p = config.get(key);
    if (p == null) {
      throw new IllegalArgumentException("config " + key + " is not set");
    }
    return p;
  }

  static long lineCount(String path) {
    try (Stream<String> lines = Files.lines(Paths.get(path), StandardCharsets.UTF_8)) {
      return lines.count();
    } catch (IOException e) {
      throw new IllegalStateException("cannot read " + path, e);
    }
  }

  static final class Admin implements SystemAdmin {
    private final String path;

    Admin(String path) {
      this.path = path;
    }

    @Override
    public Map<SystemStreamPartition, String> getOffsetsAfter(Map<SystemStreamPartition, String> offsets) {
      Map<SystemStreamPartition, String> after = new HashMap<>();
      offsets.forEach((ssp, offset) -> after.put(ssp, Long.toString(Long.parseLong(offset) + 1)));
      return after;
    }

    @Override
    public Map<String, SystemStreamMetadata> getSystemStreamMetadata(Set<String> streamNames) {
      long n = lineCount(path);
      Map<String, SystemStreamMetadata> out = new HashMap<>();
      for (String stream : streamNames) {
        SystemStreamPartitionMetadata p = n == 0
            ? new SystemStreamPartitionMetadata(null, null, "0")
            : new SystemStreamPartitionMetadata("0", Long.toString(n - 1), Long.toString(n));
        out.put(stream, new SystemStreamMetadata(stream, Collections.singletonMap(new Partition(0), p)));
      }
      return out;
    }

    @Override
    public Integer offsetComparator(String a, String b) {
      try {
        return Long.compare(Long.parseLong(a), Long.parseLong(b));
      } catch (NumberFormatException | NullPointerException e) {
        return null; // not comparable (end-of-stream)
      }
    }
  }

  static final class Consumer extends BlockingEnvelopeMap {
    private final String systemName;
    private final Config config;
    private final String path;
    private final long delayMs;
    private final boolean endOfStream;
    private final Map<SystemStreamPartition, Long> starts = new ConcurrentHashMap<>();
    private final Map<SystemStreamPartition, Thread> readers = new ConcurrentHashMap<>();
    private volatile boolean stopped;

    Consumer(String systemName, Config config, MetricsRegistry registry) {
      super(registry);
      this.systemName = systemName;
      this.config = config;
      this.path = path(systemName, config);
      this.delayMs = config.getLong("systems." + systemName + ".delay.ms", 0);
      this.endOfStream = config.getBoolean("systems." + systemName + ".end.of.stream", false);
    }

    @Override
    public void register(SystemStreamPartition ssp, String offset) {
      super.register(ssp, offset);
      starts.put(ssp, Long.parseLong(offset));
      Events.log(config, "register " + ssp.getSystem() + "." + ssp.getStream() + " " + offset);
    }

    @Override
    public void start() {
      starts.forEach((ssp, from) -> {
        Thread t = new Thread(() -> read(ssp, from), "line-reader-" + systemName);
        t.setDaemon(true);
        readers.put(ssp, t);
        t.start();
      });
    }

    private void read(SystemStreamPartition ssp, long from) {
      try (BufferedReader r = Files.newBufferedReader(Paths.get(path), StandardCharsets.UTF_8)) {
        long n = 0;
        String line;
        while (!stopped && (line = r.readLine()) != null) {
          if (n >= from) {
            put(ssp, new IncomingMessageEnvelope(ssp, Long.toString(n), null, line));
            if (delayMs > 0) {
              Thread.sleep(delayMs);
            }
          }
          n++;
        }
        if (!stopped && endOfStream) {
          put(ssp, IncomingMessageEnvelope.buildEndOfStreamEnvelope(ssp));
        }
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      } catch (IOException e) {
        setFailureCause(e);
      }
    }

    @Override
    public void stop() {
      stopped = true;
      readers.values().forEach(Thread::interrupt);
    }
  }
}
