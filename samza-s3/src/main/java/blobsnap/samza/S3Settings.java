package blobsnap.samza;

import java.net.URI;
import java.util.Locale;
import java.util.Map;
import java.util.Objects;
import org.apache.samza.config.Config;
import org.apache.samza.config.ConfigException;

/**
 * The settings of {@link S3BlobStoreManager}, read from the job's Samza config. The names mirror
 * blobsnap's settings file ({@code src/config.rs}, {@code src/blobstore/s3/config.rs}): the TOML
 * key {@code [s3] bucket} is the Samza key {@code blobsnap.s3.bucket}, and so on, so that the Rust
 * tools and the Samza job can be pointed at one bucket with the same values.
 *
 * <pre>
 * blobsnap.s3.bucket               (required) the bucket
 * blobsnap.s3.prefix               "" or ending in "/"; applied to every key (default "")
 * blobsnap.s3.endpoint             an S3-compatible server's URL (default: AWS)
 * blobsnap.s3.region               default: the AWS chain's, else us-east-1
 * blobsnap.s3.path-style           true for most S3-compatible servers (default false)
 * blobsnap.s3.create-only          how the server treats If-None-Match: * on PUT:
 *                                  auto (default), atomic, racy: send it; ignored: HEAD first
 * blobsnap.s3.connect-timeout-ms   default 3000
 * blobsnap.s3.read-timeout-ms      default 30000 (one socket read)
 * blobsnap.s3.attempt-timeout-ms   default 300000 (one request attempt)
 * blobsnap.store.max-transfers     requests in flight at once, for the whole process (default 16)
 * </pre>
 *
 * Credentials are not settings (as on the Rust side): they come from the AWS SDK's default
 * chain (system properties, environment, profiles, container and instance roles).
 */
public final class S3Settings {
  public static final String BUCKET = "blobsnap.s3.bucket";
  public static final String PREFIX = "blobsnap.s3.prefix";
  public static final String ENDPOINT = "blobsnap.s3.endpoint";
  public static final String REGION = "blobsnap.s3.region";
  public static final String PATH_STYLE = "blobsnap.s3.path-style";
  public static final String CREATE_ONLY = "blobsnap.s3.create-only";
  public static final String CONNECT_TIMEOUT_MS = "blobsnap.s3.connect-timeout-ms";
  public static final String READ_TIMEOUT_MS = "blobsnap.s3.read-timeout-ms";
  public static final String ATTEMPT_TIMEOUT_MS = "blobsnap.s3.attempt-timeout-ms";
  public static final String MAX_TRANSFERS = "blobsnap.store.max-transfers";
  /** How many of Samza's commits blobsnap's history keeps per task (a number: route 2 has no tiers). */
  public static final String RETENTION = "blobsnap.job.retention";

  /** How the server treats create-only PUTs ({@code If-None-Match: *}); the Rust {@code CreateOnlySetting}. */
  public enum CreateOnly {
    /** Not known: send the header (what the Rust side probes is fencing, which this manager does not need). */
    AUTO,
    /** AWS S3, LocalStack, MinIO. */
    ATOMIC,
    /** Checked but racy (s3s-fs). */
    RACY,
    /** Accepted and ignored (Garage 2.x): look first (HEAD), then PUT without the header. */
    IGNORED;

    static CreateOnly parse(String v) {
      switch (v.trim().toLowerCase(Locale.ROOT)) {
        case "auto":
          return AUTO;
        case "atomic":
          return ATOMIC;
        case "racy":
          return RACY;
        case "ignored":
          return IGNORED;
        default:
          throw new ConfigException(CREATE_ONLY + "=" + Layout.quote(v) + ": expected auto, atomic, racy or ignored");
      }
    }

    /** Whether a PUT carries {@code If-None-Match: *}. */
    public boolean sendsHeader() {
      return this != IGNORED;
    }
  }

  public final String bucket;
  public final String prefix;
  /** Null: AWS's endpoint for the region. */
  public final URI endpoint;
  /** Null: the AWS chain's, else us-east-1. */
  public final String region;
  public final boolean pathStyle;
  public final CreateOnly createOnly;
  public final long connectTimeoutMs;
  public final long readTimeoutMs;
  public final long attemptTimeoutMs;
  public final int maxTransfers;
  /** {@link #RETENTION}: the checkpoints blobsnap's history keeps per task (default 2). */
  public final int retention;

  private S3Settings(Builder b) {
    this.bucket = b.bucket;
    this.prefix = b.prefix;
    this.endpoint = b.endpoint;
    this.region = b.region;
    this.pathStyle = b.pathStyle;
    this.createOnly = b.createOnly;
    this.connectTimeoutMs = b.connectTimeoutMs;
    this.readTimeoutMs = b.readTimeoutMs;
    this.attemptTimeoutMs = b.attemptTimeoutMs;
    this.maxTransfers = b.maxTransfers;
    this.retention = b.retention;
  }

  /** Read and check the settings ({@link ConfigException} naming the key on a bad value). */
  public static S3Settings fromConfig(Config config) {
    return fromMap(config);
  }

  /** The same from a plain map of config lines. */
  public static S3Settings fromMap(Map<String, String> c) {
    Builder b = new Builder();
    b.bucket = c.get(BUCKET);
    b.prefix = c.getOrDefault(PREFIX, "");
    String ep = blankToNull(c.get(ENDPOINT));
    if (ep != null) {
      try {
        b.endpoint = URI.create(ep);
      } catch (IllegalArgumentException e) {
        throw new ConfigException(ENDPOINT + "=" + Layout.quote(ep) + " is not a URL", e);
      }
      if (b.endpoint.getScheme() == null || b.endpoint.getHost() == null) {
        throw new ConfigException(ENDPOINT + "=" + Layout.quote(ep) + " is not a URL such as http://127.0.0.1:9000");
      }
    }
    b.region = blankToNull(c.get(REGION));
    if (c.containsKey(PATH_STYLE)) {
      b.pathStyle = parseBool(PATH_STYLE, c.get(PATH_STYLE));
    }
    if (c.containsKey(CREATE_ONLY)) {
      b.createOnly = CreateOnly.parse(c.get(CREATE_ONLY));
    }
    b.connectTimeoutMs = parseLong(c, CONNECT_TIMEOUT_MS, b.connectTimeoutMs, 1);
    b.readTimeoutMs = parseLong(c, READ_TIMEOUT_MS, b.readTimeoutMs, 1);
    b.attemptTimeoutMs = parseLong(c, ATTEMPT_TIMEOUT_MS, b.attemptTimeoutMs, 1);
    b.maxTransfers = (int) parseLong(c, MAX_TRANSFERS, b.maxTransfers, 1);
    String r = blankToNull(c.get(RETENTION));
    if (r != null && !r.trim().matches("[0-9]+")) {
      throw new ConfigException(RETENTION + "=" + Layout.quote(r) + ": Samza's own engine (samza-s3) keeps the last N"
          + " checkpoints in blobsnap's history, a number such as 3; tiers (\"every 1h for 1d\") are route 1's");
    }
    b.retention = (int) parseLong(c, RETENTION, b.retention, 1);
    return b.build();
  }

  /** Settings built in code (tests, embedding). */
  public static final class Builder {
    private String bucket;
    private String prefix = "";
    private URI endpoint;
    private String region;
    private boolean pathStyle;
    private CreateOnly createOnly = CreateOnly.AUTO;
    private long connectTimeoutMs = 3_000;
    private long readTimeoutMs = 30_000;
    private long attemptTimeoutMs = 300_000;
    private int maxTransfers = 16;
    private int retention = 2;

    public Builder bucket(String v) {
      bucket = v;
      return this;
    }

    public Builder prefix(String v) {
      prefix = v;
      return this;
    }

    public Builder endpoint(URI v) {
      endpoint = v;
      return this;
    }

    public Builder region(String v) {
      region = v;
      return this;
    }

    public Builder pathStyle(boolean v) {
      pathStyle = v;
      return this;
    }

    public Builder createOnly(CreateOnly v) {
      createOnly = v;
      return this;
    }

    public Builder connectTimeoutMs(long v) {
      connectTimeoutMs = v;
      return this;
    }

    public Builder readTimeoutMs(long v) {
      readTimeoutMs = v;
      return this;
    }

    public Builder attemptTimeoutMs(long v) {
      attemptTimeoutMs = v;
      return this;
    }

    public Builder maxTransfers(int v) {
      maxTransfers = v;
      return this;
    }

    public Builder retention(int v) {
      retention = v;
      return this;
    }

    public S3Settings build() {
      validateBucket(bucket);
      validatePrefix(prefix);
      if (maxTransfers < 1) {
        throw new ConfigException(MAX_TRANSFERS + " must be at least 1");
      }
      return new S3Settings(this);
    }
  }

  public static Builder builder() {
    return new Builder();
  }

  /** As the Rust {@code S3Config::validate}: 3-63 of a-z 0-9 . - */
  static void validateBucket(String bucket) {
    if (bucket == null || bucket.trim().isEmpty()) {
      throw new ConfigException(BUCKET + " is required (the bucket blobsnap's layout lives in)");
    }
    boolean ok = bucket.length() >= 3 && bucket.length() <= 63;
    for (int i = 0; ok && i < bucket.length(); i++) {
      char ch = bucket.charAt(i);
      ok = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '.';
    }
    if (!ok) {
      throw new ConfigException(BUCKET + "=" + Layout.quote(bucket) + " is not a valid bucket name (3-63 of a-z 0-9 . -)");
    }
  }

  /** As the Rust {@code Scope::new}: empty, or valid key segments followed by "/". */
  static void validatePrefix(String prefix) {
    if (prefix == null || prefix.isEmpty()) {
      return;
    }
    String why = null;
    if (!prefix.endsWith("/")) {
      why = "must be empty or end in '/'";
    } else if (prefix.length() > Layout.MAX_KEY_LEN) {
      why = "is longer than S3's 1024-byte keys";
    } else {
      for (String seg : prefix.substring(0, prefix.length() - 1).split("/", -1)) {
        if (seg.isEmpty() || seg.equals(".") || seg.equals("..") || seg.contains("\\")) {
          why = "has an empty, '.', '..' or backslashed segment";
          break;
        }
      }
      for (int i = 0; why == null && i < prefix.length(); i++) {
        if (Character.isISOControl(prefix.charAt(i))) {
          why = "contains a control character";
        }
      }
    }
    if (why != null) {
      throw new ConfigException(PREFIX + "=" + Layout.quote(prefix) + " " + why);
    }
  }

  private static String blankToNull(String v) {
    return v == null || v.trim().isEmpty() ? null : v.trim();
  }

  private static boolean parseBool(String key, String v) {
    switch (v.trim().toLowerCase(Locale.ROOT)) {
      case "1":
      case "true":
      case "yes":
        return true;
      case "0":
      case "false":
      case "no":
        return false;
      default:
        throw new ConfigException(key + "=" + Layout.quote(v) + ": expected true or false");
    }
  }

  private static long parseLong(Map<String, String> c, String key, long dflt, long min) {
    String v = c.get(key);
    if (v == null || v.trim().isEmpty()) {
      return dflt;
    }
    long n;
    try {
      n = Long.parseLong(v.trim());
    } catch (NumberFormatException e) {
      throw new ConfigException(key + "=" + Layout.quote(v) + ": not a number");
    }
    if (n < min || n > Integer.MAX_VALUE) {
      throw new ConfigException(key + "=" + Layout.quote(v) + ": must be within " + min + ".." + Integer.MAX_VALUE);
    }
    return n;
  }

  @Override
  public boolean equals(Object o) {
    if (this == o) {
      return true;
    }
    if (!(o instanceof S3Settings)) {
      return false;
    }
    S3Settings s = (S3Settings) o;
    return pathStyle == s.pathStyle && connectTimeoutMs == s.connectTimeoutMs && readTimeoutMs == s.readTimeoutMs
        && attemptTimeoutMs == s.attemptTimeoutMs && maxTransfers == s.maxTransfers && bucket.equals(s.bucket)
        && prefix.equals(s.prefix) && Objects.equals(endpoint, s.endpoint) && Objects.equals(region, s.region)
        && createOnly == s.createOnly;
  }

  @Override
  public int hashCode() {
    return Objects.hash(bucket, prefix, endpoint, region, pathStyle, createOnly, connectTimeoutMs, readTimeoutMs,
        attemptTimeoutMs, maxTransfers);
  }

  @Override
  public String toString() {
    return "s3://" + bucket + "/" + prefix + (endpoint != null ? " at " + endpoint : "");
  }
}
