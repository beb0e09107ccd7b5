package blobsnap.samza;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.HashMap;
import java.util.Map;
import org.apache.samza.SamzaException;
import org.apache.samza.config.ConfigException;
import org.junit.jupiter.api.Test;

/** The layout's strings, pinned to the same golden values as the Rust side's tests. */
class LayoutTest {
  /** {@code src/blobstore/key.rs}: escape_segment_golden. */
  @Test
  void escapeSegmentGolden() {
    assertEquals("wordcount", Layout.escapeSegment("wordcount"));
    assertEquals("Partition%200", Layout.escapeSegment("Partition 0"));
    assertEquals("a%2Eb", Layout.escapeSegment("a.b"));
    assertEquals("job_id-1", Layout.escapeSegment("job_id-1"));
    assertEquals("%2E%2E%2Fx", Layout.escapeSegment("../x"));
    assertEquals("%25", Layout.escapeSegment("%"));
    assertEquals("%C3%A9", Layout.escapeSegment("é"));
    assertEquals("a%2Fb%00", Layout.escapeSegment("a/b\0"));
    assertThrows(IllegalArgumentException.class, () -> Layout.escapeSegment(""));
  }

  /** {@code src/layout.rs}: layout_golden. */
  @Test
  void keysGolden() {
    String scope = Layout.storeScope("", "word.count", "1", "Partition 0", "counts");
    assertEquals("word%2Ecount/1/tasks/Partition%200/stores/counts/", scope);
    String emptySha = S3BlobStoreManager.hex(S3BlobStoreManager.sha256().digest(new byte[0]));
    assertEquals("word%2Ecount/1/tasks/Partition%200/stores/counts/blobs/1700000000123-0/"
        + "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        scope + Layout.blobId("1700000000123-0", emptySha));
    String indexSha = S3BlobStoreManager.hex(S3BlobStoreManager.sha256().digest("{}".getBytes(StandardCharsets.UTF_8)));
    assertEquals("word%2Ecount/1/tasks/Partition%200/stores/counts/index/1700000000123-0."
        + "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a.json",
        scope + Layout.marker("1700000000123-0", indexSha));
    assertEquals("prod/word%2Ecount/1/tasks/Partition%200/stores/counts/",
        Layout.storeScope("prod/", "word.count", "1", "Partition 0", "counts"));
    // Listing "Partition 1" never returns "Partition 10".
    assertFalse(Layout.storeScope("", "j", "1", "Partition 10", "s")
        .startsWith(Layout.storeScope("", "j", "1", "Partition 1", "s")));
  }

  @Test
  void idsParseBackAndRefuseOthers() {
    String sha = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    Layout.ParsedId b = Layout.parseId("blobs/1700000000123-456/" + sha);
    assertFalse(b.index);
    assertEquals("1700000000123-456", b.checkpointId);
    assertEquals(sha, b.sha256);
    Layout.ParsedId m = Layout.parseId("index/1700000000123-456." + sha + ".json");
    assertTrue(m.index);
    assertEquals("1700000000123-456", m.checkpointId);
    for (String bad : new String[] {"", "blobs/1-2", "blobs/1-2/" + sha + "/x", "blobs/1-2/" + sha.toUpperCase(),
        "blobs/1--2/" + sha, "blobs/01-2/" + sha, "blobs/1-2-3/" + sha, "index/1-2.json", "index/1-2." + sha,
        "../blobs/1-2/" + sha, "snapshot-index-123", "/abs/path/file.sst", "borrowed/0/blobs/1-2/" + sha,
        "blobs/99999999999999999999-1/" + sha}) {
      assertThrows(SamzaException.class, () -> Layout.parseId(bad), bad);
    }
  }

  @Test
  void checkpointIdOfSamzasCheckpointDirs() {
    Path base = Paths.get("/var/samza/state");
    assertEquals("1700000000123-456", Layout.checkpointIdOfFile(
        base.resolve("counts/Partition_0-1700000000123-456/000012.sst"), "counts"));
    // Nested files, a task name with dashes and digits, a store name with a space.
    assertEquals("17-0", Layout.checkpointIdOfFile(
        base.resolve("my_store/Partition-1-2-17-0/sub/dir/MANIFEST-000001"), "my store"));
    for (String bad : new String[] {"counts/Partition_0/000012.sst", "counts/Partition_0-17--5/x",
        "other/Partition_0-17-5/x", "counts/Partition_0-17-5", "x"}) {
      assertThrows(SamzaException.class, () -> Layout.checkpointIdOfFile(base.resolve(bad), "counts"), bad);
    }
  }

  @Test
  void settingsMirrorTheRustKeys() {
    Map<String, String> c = new HashMap<>();
    assertThrows(ConfigException.class, () -> S3Settings.fromMap(c));
    c.put("blobsnap.s3.bucket", "state-backups");
    c.put("blobsnap.s3.prefix", "prod/");
    c.put("blobsnap.s3.endpoint", "http://127.0.0.1:9000");
    c.put("blobsnap.s3.path-style", "true");
    c.put("blobsnap.s3.create-only", "ignored");
    c.put("blobsnap.store.max-transfers", "4");
    S3Settings s = S3Settings.fromMap(c);
    assertEquals("state-backups", s.bucket);
    assertEquals("prod/", s.prefix);
    assertTrue(s.pathStyle);
    assertEquals(S3Settings.CreateOnly.IGNORED, s.createOnly);
    assertEquals(4, s.maxTransfers);
    assertEquals(s, S3Settings.fromMap(c));
    for (String[] bad : new String[][] {{"blobsnap.s3.prefix", "prod"}, {"blobsnap.s3.prefix", "a//"},
        {"blobsnap.s3.bucket", "Bad_Bucket"}, {"blobsnap.s3.path-style", "maybe"},
        {"blobsnap.s3.create-only", "sometimes"}, {"blobsnap.store.max-transfers", "0"},
        {"blobsnap.s3.endpoint", "not a url"}}) {
      Map<String, String> c2 = new HashMap<>(c);
      c2.put(bad[0], bad[1]);
      ConfigException e = assertThrows(ConfigException.class, () -> S3Settings.fromMap(c2), bad[0]);
      assertTrue(e.getMessage().contains(bad[0]), e.getMessage());
    }
  }
}
