package blobsnap.samza;

import java.net.URI;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.UUID;
import software.amazon.awssdk.auth.credentials.AwsBasicCredentials;
import software.amazon.awssdk.auth.credentials.StaticCredentialsProvider;
import software.amazon.awssdk.core.sync.RequestBody;
import software.amazon.awssdk.regions.Region;
import software.amazon.awssdk.services.s3.S3Client;
import software.amazon.awssdk.services.s3.model.ListObjectsV2Request;
import software.amazon.awssdk.services.s3.model.ListObjectsV2Response;
import software.amazon.awssdk.services.s3.model.PutObjectRequest;
import software.amazon.awssdk.services.s3.model.S3Object;

/**
 * The S3 server the tests run against: LocalStack (or any S3) named by the variables
 * {@code minio/localstack.sh env} prints. A test that finds none FAILS: it is never skipped.
 */
final class S3Test {
  static final String HOW = "no S3 server for the tests: start one and export its variables, e.g.\n"
      + "  LOCALSTACK_STATE=/tmp/ls bash minio/localstack.sh start\n"
      + "  eval \"$(LOCALSTACK_STATE=/tmp/ls bash minio/localstack.sh env | sed 's/^/export /')\"\n"
      + "then run mvn test again (the tests fail, never skip, without a server)";

  private S3Test() {
  }

  static String env(String name, String dflt) {
    String v = System.getenv(name);
    return v == null || v.isEmpty() ? dflt : v;
  }

  /** The server's endpoint; fails the test when none is configured. */
  static URI endpoint() {
    String ep = env("BLOBSNAP_TEST_S3_ENDPOINT", null);
    if (ep == null) {
      throw new AssertionError(HOW);
    }
    URI uri = URI.create(ep);
    String host = uri.getHost();
    if (!"127.0.0.1".equals(host) && !"localhost".equals(host) && !"[::1]".equals(host)) {
      throw new AssertionError("BLOBSNAP_TEST_S3_ENDPOINT=" + ep + ": the tests only talk to loopback servers");
    }
    return uri;
  }

  static StaticCredentialsProvider credentials() {
    return StaticCredentialsProvider.create(AwsBasicCredentials.create(
        env("BLOBSNAP_TEST_S3_ACCESS_KEY", "test"), env("BLOBSNAP_TEST_S3_SECRET_KEY", "test")));
  }

  static String region() {
    return env("BLOBSNAP_TEST_S3_REGION", "us-east-1");
  }

  /** A raw client for setting up and checking the bucket. */
  static S3Client rawClient() {
    return S3Client.builder()
        .endpointOverride(endpoint())
        .forcePathStyle(true)
        .region(Region.of(region()))
        .credentialsProvider(credentials())
        .httpClientBuilder(software.amazon.awssdk.http.apache5.Apache5HttpClient.builder())
        .build();
  }

  /** A new bucket of its own for a test class. */
  static String newBucket(S3Client raw, String what) {
    String bucket = ("blobsnap-samza-" + what + "-" + UUID.randomUUID().toString().substring(0, 8))
        .toLowerCase(Locale.ROOT);
    try {
      raw.createBucket(b -> b.bucket(bucket));
    } catch (RuntimeException e) {
      throw new AssertionError("cannot create bucket " + bucket + " at " + endpoint() + " (is the server up?): " + e
          + "\n" + HOW, e);
    }
    return bucket;
  }

  static S3Settings.Builder settings(String bucket, String prefix) {
    return S3Settings.builder()
        .bucket(bucket)
        .prefix(prefix)
        .endpoint(endpoint())
        .region(region())
        .pathStyle(true);
  }

  /** Every key under {@code prefix}, in order. */
  static List<S3Object> list(S3Client raw, String bucket, String prefix) {
    List<S3Object> out = new ArrayList<>();
    String token = null;
    do {
      ListObjectsV2Response r = raw.listObjectsV2(ListObjectsV2Request.builder()
          .bucket(bucket).prefix(prefix).continuationToken(token).build());
      out.addAll(r.contents());
      token = r.isTruncated() ? r.nextContinuationToken() : null;
    } while (token != null);
    return out;
  }

  static void putRaw(S3Client raw, String bucket, String key, byte[] bytes) {
    raw.putObject(PutObjectRequest.builder().bucket(bucket).key(key).build(), RequestBody.fromBytes(bytes));
  }

  static byte[] getRaw(S3Client raw, String bucket, String key) {
    return raw.getObjectAsBytes(b -> b.bucket(bucket).key(key)).asByteArray();
  }

  /** Where the tests leave what the Rust side reads next (a listing, an index). */
  /**
   * Whether {@code key} is one of blobsnap's history records under job scope {@code jobScope}
   * (History): a checkpoint document {@code checkpoints/<task>/<seq:020>.json} or a per-store
   * prepared record {@code prepared/<task>/<checkpoint-id>.<store>.json}.
   */
  static boolean isHistoryRecord(String jobScope, String key) {
    if (!key.startsWith(jobScope)) {
      return false;
    }
    String rel = key.substring(jobScope.length());
    return rel.matches("checkpoints/[^/]+/[0-9]{20}\\.json") || rel.matches("prepared/[^/]+/[0-9]+-[0-9]+\\.[^/.]+\\.json");
  }

  /**
   * Returns once the server's clock is past the last-modified of {@code key} (S3 times have a
   * second's granularity): a sweep started now finds {@code key} older than a grace of 0. Reads
   * the server's clock from the last-modified of a probe object outside any job scope.
   */
  static void serverClockPast(S3Client raw, String bucket, String key) throws InterruptedException {
    java.time.Instant written = raw.headObject(b -> b.bucket(bucket).key(key)).lastModified();
    for (int i = 0; i < 300; i++) {
      putRaw(raw, bucket, "clock-probe", new byte[0]);
      if (raw.headObject(b -> b.bucket(bucket).key("clock-probe")).lastModified().isAfter(written)) {
        raw.deleteObject(b -> b.bucket(bucket).key("clock-probe"));
        return;
      }
      Thread.sleep(50);
    }
    throw new AssertionError("the server's clock did not pass the last-modified of " + key + " in 15 s");
  }

  static Path evidenceDir() {
    return Paths.get(System.getProperty("blobsnap.samza.s3.evidence", "target/evidence")).toAbsolutePath();
  }
}
