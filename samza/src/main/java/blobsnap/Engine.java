package blobsnap;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executor;
import org.apache.samza.config.Config;
import org.apache.samza.storage.blobstore.exceptions.RetriableException;

/**
 * blobsnap's engine as the Samza classes open it: the settings are Samza's {@code blobsnap.*}
 * config entries, the settings file's keys one to one ({@code blobsnap.store.kind=s3},
 * {@code blobsnap.s3.bucket=...}, {@code blobsnap.job.retention=2}); the native library opens
 * the store once per distinct settings in a JVM.
 */
final class Engine {
  static final String PREFIX = "blobsnap.";

  final long handle;
  final String job;
  final String jobId;

  private Engine(long handle, String job, String jobId) {
    this.handle = handle;
    this.job = job;
    this.jobId = jobId;
  }

  static Engine open(Config config) {
    String job = config.get("job.name");
    if (job == null || job.isEmpty()) {
      throw new BlobsnapException("invalid-input", "job.name is not set");
    }
    String jobId = config.get("job.id", "1");
    Map<String, String> mine = new TreeMap<>();
    for (Map.Entry<String, String> e : config.entrySet()) {
      if (e.getKey().startsWith(PREFIX)) {
        mine.put(e.getKey().substring(PREFIX.length()), e.getValue());
      }
    }
    return new Engine(Native.engineOpen(flat(mine)), job, jobId);
  }

  static String[] flat(Map<String, String> m) {
    List<String> out = new ArrayList<>(m.size() * 2);
    for (Map.Entry<String, String> e : new TreeMap<>(m).entrySet()) {
      out.add(e.getKey());
      out.add(e.getValue());
    }
    return out.toArray(new String[0]);
  }

  static Map<String, String> map(String[] flat) {
    Map<String, String> out = new TreeMap<>();
    for (int i = 0; i + 1 < flat.length; i += 2) {
      out.put(flat[i], flat[i + 1]);
    }
    return out;
  }

  /**
   * The future a caller gets: completed from {@code executor} (never on a runtime worker of the
   * native library), a transient failure as Samza's {@link RetriableException}.
   */
  static <T> CompletableFuture<T> handOff(CompletableFuture<T> raw, Executor executor) {
    CompletableFuture<T> out = new CompletableFuture<>();
    raw.whenCompleteAsync((v, e) -> {
      if (e == null) {
        out.complete(v);
      } else {
        out.completeExceptionally(translate(e));
      }
    }, executor);
    return out;
  }

  static Throwable translate(Throwable e) {
    if (e instanceof BlobsnapException && ((BlobsnapException) e).retriable()) {
      return new RetriableException(e.getMessage(), e);
    }
    return e;
  }
}
