package blobsnap.samza;

import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import software.amazon.awssdk.auth.credentials.AwsCredentialsProvider;
import software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider;
import software.amazon.awssdk.awscore.retry.AwsRetryStrategy;
import software.amazon.awssdk.core.checksums.RequestChecksumCalculation;
import software.amazon.awssdk.core.checksums.ResponseChecksumValidation;
import software.amazon.awssdk.core.client.config.ClientOverrideConfiguration;
import software.amazon.awssdk.http.apache5.Apache5HttpClient;
import software.amazon.awssdk.regions.Region;
import software.amazon.awssdk.regions.providers.DefaultAwsRegionProviderChain;
import software.amazon.awssdk.services.s3.S3Client;
import software.amazon.awssdk.services.s3.S3ClientBuilder;

/**
 * One S3 client and one bounded pool of I/O threads, shared by every {@link S3BlobStoreManager}
 * of the process with the same settings (Samza makes one manager per task for backup and one
 * for restore; the Rust side has one transfer budget per process too): reference-counted,
 * closed by the last {@link #release}.
 *
 * <p>The SDK's own retries are off: Samza's engine retries {@code RetriableException}s (with
 * backoff, for up to 15 minutes), and exactly one retry layer must exist. Connect, read and
 * per-attempt timeouts are explicit, so a stalled endpoint fails (retriably) instead of hanging.
 * Checksums are computed "when required" only (the manager sends its own SHA-256), as on the
 * Rust side: the SDK's default CRC trailers (aws-chunked) are not understood by every
 * S3-compatible server.
 */
final class S3Transport {
  private static final Logger LOG = LoggerFactory.getLogger(S3Transport.class);
  private static final Map<Key, S3Transport> SHARED = new HashMap<>();

  /** What makes two managers share a transport: equal settings and the same credentials source. */
  private static final class Key {
    final S3Settings settings;
    final AwsCredentialsProvider credentials;

    Key(S3Settings settings, AwsCredentialsProvider credentials) {
      this.settings = settings;
      this.credentials = credentials;
    }

    @Override
    public boolean equals(Object o) {
      return o instanceof Key && ((Key) o).settings.equals(settings) && ((Key) o).credentials == credentials;
    }

    @Override
    public int hashCode() {
      return settings.hashCode() * 31 + System.identityHashCode(credentials);
    }
  }

  final S3Settings settings;
  final S3Client client;
  /** Blocking S3 calls run here: at most {@code max-transfers} at once. */
  final ExecutorService io;
  /**
   * The owner records ({@code <prefix><job>/<job-id>/scope.json} keys, in this transport's
   * bucket) found or written as Samza's engine's: checked once per process, before the first
   * put into the job scope ({@link S3BlobStoreManager}).
   */
  final Set<String> ownedScopes = ConcurrentHashMap.newKeySet();
  /** Owner records known to say {@code "history": "prepared"} (OwnerRecord#recordHistory). */
  final Set<String> historyScopes = ConcurrentHashMap.newKeySet();
  private final Key key;
  private int users;

  private S3Transport(Key key) {
    this.key = key;
    this.settings = key.settings;
    this.client = buildClient(key.settings, key.credentials);
    AtomicInteger n = new AtomicInteger();
    ThreadFactory tf = r -> {
      Thread t = new Thread(r, "blobsnap-s3-" + n.incrementAndGet());
      t.setDaemon(true);
      return t;
    };
    ThreadPoolExecutor pool = new ThreadPoolExecutor(settings.maxTransfers, settings.maxTransfers, 60, TimeUnit.SECONDS,
        new LinkedBlockingQueue<>(), tf);
    pool.allowCoreThreadTimeOut(true);
    this.io = pool;
  }

  /**
   * The transport of these settings, shared; {@code credentials} null for the SDK's default
   * chain. Each call must be matched by one {@link #release}.
   */
  static S3Transport acquire(S3Settings settings, AwsCredentialsProvider credentials) {
    Key k = new Key(settings, credentials);
    synchronized (SHARED) {
      S3Transport t = SHARED.get(k);
      if (t == null) {
        t = new S3Transport(k);
        SHARED.put(k, t);
        LOG.info("blobsnap: S3 transport for {} ({} transfers at once, create-only {})", settings,
            settings.maxTransfers, settings.createOnly.name().toLowerCase(java.util.Locale.ROOT));
      }
      t.users++;
      return t;
    }
  }

  /** Drop one use; the last one shuts the pool down and closes the client. */
  void release() {
    boolean last;
    synchronized (SHARED) {
      users--;
      last = users == 0;
      if (last) {
        SHARED.remove(key);
      }
    }
    if (last) {
      io.shutdown();
      try {
        if (!io.awaitTermination(10, TimeUnit.SECONDS)) {
          LOG.warn("blobsnap: S3 requests still running 10 s after close; cancelling them");
          io.shutdownNow();
        }
      } catch (InterruptedException e) {
        io.shutdownNow();
        Thread.currentThread().interrupt();
      }
      client.close();
    }
  }

  private static S3Client buildClient(S3Settings s, AwsCredentialsProvider credentials) {
    Apache5HttpClient.Builder http = Apache5HttpClient.builder()
        .connectionTimeout(Duration.ofMillis(s.connectTimeoutMs))
        .socketTimeout(Duration.ofMillis(s.readTimeoutMs))
        .maxConnections(Math.max(s.maxTransfers, 1));
    S3ClientBuilder b = S3Client.builder()
        .httpClientBuilder(http)
        .overrideConfiguration(ClientOverrideConfiguration.builder()
            .retryStrategy(AwsRetryStrategy.doNotRetry())
            .apiCallAttemptTimeout(Duration.ofMillis(s.attemptTimeoutMs))
            .build())
        .forcePathStyle(s.pathStyle)
        .requestChecksumCalculation(RequestChecksumCalculation.WHEN_REQUIRED)
        .responseChecksumValidation(ResponseChecksumValidation.WHEN_REQUIRED)
        .credentialsProvider(credentials != null ? credentials : DefaultCredentialsProvider.builder().build());
    b.region(Region.of(s.region != null ? s.region : defaultRegion()));
    if (s.endpoint != null) {
      b.endpointOverride(s.endpoint);
    }
    return b.build();
  }

  /** The AWS chain's region, else us-east-1 (as the Rust side). */
  private static String defaultRegion() {
    try {
      return DefaultAwsRegionProviderChain.builder().build().getRegion().id();
    } catch (RuntimeException e) {
      return "us-east-1";
    }
  }
}
