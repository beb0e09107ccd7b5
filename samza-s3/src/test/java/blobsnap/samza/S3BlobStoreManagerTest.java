package blobsnap.samza;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.FileInputStream;
import java.io.InputStream;
import java.net.ServerSocket;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Optional;
import java.util.Random;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import java.util.stream.Collectors;
import java.util.zip.CRC32;
import java.util.zip.CheckedInputStream;
import org.apache.samza.SamzaException;
import org.apache.samza.checkpoint.CheckpointId;
import org.apache.samza.storage.blobstore.Metadata;
import org.apache.samza.storage.blobstore.exceptions.DeletedException;
import org.apache.samza.storage.blobstore.exceptions.RetriableException;
import org.apache.samza.storage.blobstore.index.DirIndex;
import org.apache.samza.storage.blobstore.index.FileBlob;
import org.apache.samza.storage.blobstore.index.FileIndex;
import org.apache.samza.storage.blobstore.index.FileMetadata;
import org.apache.samza.storage.blobstore.index.SnapshotIndex;
import org.apache.samza.storage.blobstore.index.SnapshotMetadata;
import org.apache.samza.storage.blobstore.index.serde.SnapshotIndexSerde;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import software.amazon.awssdk.services.s3.S3Client;
import software.amazon.awssdk.services.s3.model.S3Object;

/** The manager's calls one by one against a real S3 server (LocalStack): keys, ids, errors. */
class S3BlobStoreManagerTest {
  static final String JOB = "word.count";
  static final String JOB_ID = "1";
  static final String TASK = "Partition 0";
  static final String STORE = "counts";
  static final String CID = "1700000000123-456";
  static final String SCOPE = "t/word%2Ecount/1/tasks/Partition%200/stores/counts/";

  static S3Client raw;
  static String bucket;
  static ExecutorService samza;

  @TempDir
  Path tmp;

  @BeforeAll
  static void setUp() {
    raw = S3Test.rawClient();
    bucket = S3Test.newBucket(raw, "unit");
    samza = Executors.newFixedThreadPool(2, r -> new Thread(r, "samza-commit-test"));
  }

  @AfterAll
  static void tearDown() throws InterruptedException {
    if (samza != null) {
      samza.shutdown();
      samza.awaitTermination(5, TimeUnit.SECONDS);
    }
    if (raw != null) {
      raw.close();
    }
  }

  static S3BlobStoreManager manager(S3Settings.Builder b) {
    S3BlobStoreManager m = new S3BlobStoreManager(b.build(), samza, S3Test.credentials());
    m.init();
    return m;
  }

  static S3BlobStoreManager manager() {
    return manager(S3Test.settings(bucket, "t/"));
  }

  static Metadata md(String payloadPath, long size) {
    return new Metadata(payloadPath, size < 0 ? Optional.empty() : Optional.of(size), JOB, JOB_ID, TASK, STORE);
  }

  /** A file inside a Samza checkpoint dir, as Samza's backup manager hands it over. */
  Path checkpointFile(String cid, String name, byte[] bytes) throws Exception {
    Path dir = tmp.resolve("state").resolve(STORE).resolve("Partition_0-" + cid);
    Path f = dir.resolve(name);
    Files.createDirectories(f.getParent());
    Files.write(f, bytes);
    return f;
  }

  static <T> T join(CompletionStage<T> f) throws Exception {
    return f.toCompletableFuture().get(60, TimeUnit.SECONDS);
  }

  /** The failure of {@code f}, unwrapped as Samza's FutureUtil unwraps it. */
  static Throwable failure(CompletionStage<?> f) throws Exception {
    try {
      f.toCompletableFuture().get(60, TimeUnit.SECONDS);
    } catch (ExecutionException e) {
      return e.getCause();
    }
    fail("expected a failure");
    return null;
  }

  /** {@code e} is of {@code type}; the message shows what it was otherwise. */
  static void assertKind(Class<? extends Throwable> type, Throwable e) {
    if (!type.isInstance(e)) {
      java.io.StringWriter w = new java.io.StringWriter();
      e.printStackTrace(new java.io.PrintWriter(w));
      fail("expected " + type.getSimpleName() + ", got " + w);
    }
  }

  static String sha(byte[] b) {
    return S3BlobStoreManager.hex(S3BlobStoreManager.sha256().digest(b));
  }

  static byte[] randomBytes(int n, long seed) {
    byte[] b = new byte[n];
    new Random(seed).nextBytes(b);
    return b;
  }

  @Test
  void fileRoundTripWithExactKeyAndSamzasCrc() throws Exception {
    S3BlobStoreManager m = manager();
    try {
      byte[] bytes = randomBytes(300_000, 1);
      Path f = checkpointFile(CID, "000012.sst", bytes);
      CheckedInputStream in = new CheckedInputStream(new FileInputStream(f.toFile()), new CRC32());
      AtomicReference<String> thread = new AtomicReference<>();
      String id = join(m.put(in, md(f.toString(), bytes.length)).whenComplete((r, e) ->
          thread.set(Thread.currentThread().getName())));
      in.close();
      assertEquals("blobs/" + CID + "/" + sha(bytes), id);
      // The future completed on Samza's executor, not on an I/O thread.
      assertEquals("samza-commit-test", thread.get());
      // Samza records the CRC32 of what the manager read: all of it.
      CRC32 crc = new CRC32();
      crc.update(bytes);
      assertEquals(crc.getValue(), in.getChecksum().getValue());
      // The exact key, percent-encoding and all.
      String key = SCOPE + "blobs/" + CID + "/" + sha(bytes);
      assertArrayEquals(bytes, S3Test.getRaw(raw, bucket, key));

      ByteArrayOutputStream out = new ByteArrayOutputStream();
      join(m.get(id, out, md(tmp.resolve("restored/000012.sst").toString(), bytes.length)));
      assertArrayEquals(bytes, out.toByteArray());

      // The same file again (Samza's retry after a lost response, or two identical files of
      // one checkpoint): the key exists with the same bytes, which is success.
      String again = join(m.put(new ByteArrayInputStream(bytes), md(f.toString(), bytes.length)));
      assertEquals(id, again);

      // Nested files and empty files.
      Path nested = checkpointFile(CID, "sub/dir/empty", new byte[0]);
      String emptyId = join(m.put(new ByteArrayInputStream(new byte[0]), md(nested.toString(), 0)));
      assertEquals("blobs/" + CID + "/e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", emptyId);
      ByteArrayOutputStream empty = new ByteArrayOutputStream();
      join(m.get(emptyId, empty, md("x", 0)));
      assertEquals(0, empty.size());
    } finally {
      m.close();
    }
  }

  static SnapshotIndex index(String cid, List<FileIndex> files) {
    DirIndex root = new DirIndex(DirIndex.ROOT_DIR_NAME, files, Collections.emptyList(), Collections.emptyList(),
        Collections.emptyList());
    return new SnapshotIndex(1_700_000_000_999L, new SnapshotMetadata(CheckpointId.deserialize(cid), JOB, JOB_ID,
        TASK, STORE), root, Optional.empty());
  }

  @Test
  void indexRoundTripUnderItsMarker() throws Exception {
    S3BlobStoreManager m = manager();
    try {
      FileIndex file = new FileIndex("000012.sst", Collections.singletonList(new FileBlob("blobs/" + CID + "/"
          + sha(new byte[] {1}), 0)), new FileMetadata(1L, 2L, 1L, "root", "root", "rw-r--r--"), 42L);
      byte[] bytes = new SnapshotIndexSerde().toBytes(index(CID, Collections.singletonList(file)));
      String marker = join(m.put(new ByteArrayInputStream(bytes),
          md(Metadata.SNAPSHOT_INDEX_PAYLOAD_PATH, bytes.length)));
      assertEquals("index/" + CID + "." + sha(bytes) + ".json", marker);
      assertArrayEquals(bytes, S3Test.getRaw(raw, bucket, SCOPE + marker));

      ByteArrayOutputStream out = new ByteArrayOutputStream();
      join(m.get(marker, out, md(Metadata.SNAPSHOT_INDEX_PAYLOAD_PATH, -1)));
      assertArrayEquals(bytes, out.toByteArray());
      assertEquals(file, new SnapshotIndexSerde().fromBytes(out.toByteArray()).getDirIndex().getFilesPresent().get(0));

      // A retried index PUT: same bytes, same marker.
      assertEquals(marker, join(m.put(new ByteArrayInputStream(bytes),
          md(Metadata.SNAPSHOT_INDEX_PAYLOAD_PATH, bytes.length))));

      // An index of another store is refused before anything is written.
      Metadata other = new Metadata(Metadata.SNAPSHOT_INDEX_PAYLOAD_PATH, Optional.of((long) bytes.length), JOB,
          JOB_ID, TASK, "other");
      Throwable e = failure(m.put(new ByteArrayInputStream(bytes), other));
      assertKind(SamzaException.class, e);
      assertTrue(e.getMessage().contains("store-name"), e.getMessage());
    } finally {
      m.close();
    }
  }

  @Test
  void deleteIsDeferredAndRemoveTtlCallsTheHookForIndexesOnly() throws Exception {
    List<String> committed = new ArrayList<>();
    S3BlobStoreManager m = new S3BlobStoreManager(S3Test.settings(bucket, "t/").build(), samza, S3Test.credentials()) {
      @Override
      protected CompletionStage<Void> onIndexCommitted(CommittedIndex c) {
        committed.add(c.key());
        return super.onIndexCommitted(c);
      }
    };
    m.init();
    try {
      byte[] bytes = "delete me not".getBytes(StandardCharsets.UTF_8);
      Path f = checkpointFile(CID, "OPTIONS-000007", bytes);
      String id = join(m.put(new ByteArrayInputStream(bytes), md(f.toString(), bytes.length)));
      join(m.delete(id, md("OPTIONS-000007", bytes.length)));
      assertEquals(1, m.deferredDeletes());
      assertArrayEquals(bytes, S3Test.getRaw(raw, bucket, SCOPE + id), "delete must leave the blob");

      join(m.removeTTL(id, md("OPTIONS-000007", bytes.length)));
      assertTrue(committed.isEmpty());
      String marker = "index/" + CID + "." + sha(new byte[] {7}) + ".json";
      join(m.removeTTL(marker, md(Metadata.SNAPSHOT_INDEX_PAYLOAD_PATH, -1)));
      assertEquals(Collections.singletonList(SCOPE + marker), committed);

      assertKind(SamzaException.class, failure(m.delete("../../etc/passwd", md("x", -1))));
      assertKind(SamzaException.class, failure(m.removeTTL("snapshot-index-1", md("x", -1))));
    } finally {
      m.close();
    }
  }

  @Test
  void missingKeyIsDeleted() throws Exception {
    S3BlobStoreManager m = manager();
    try {
      Throwable e = failure(m.get("blobs/" + CID + "/" + sha(new byte[] {9, 9}), new ByteArrayOutputStream(),
          md("x", -1)));
      assertKind(DeletedException.class, e);
      assertTrue(e.getMessage().contains(SCOPE), e.getMessage());
      Throwable i = failure(m.get("index/" + CID + "." + sha(new byte[] {9}) + ".json", new ByteArrayOutputStream(),
          md(Metadata.SNAPSHOT_INDEX_PAYLOAD_PATH, -1)));
      assertKind(DeletedException.class, i);
    } finally {
      m.close();
    }
  }

  @Test
  void corruptOrForeignObjectsAreRefused() throws Exception {
    S3BlobStoreManager m = manager();
    try {
      byte[] good = "good".getBytes(StandardCharsets.UTF_8);
      String id = "blobs/" + CID + "/" + sha(good);
      S3Test.putRaw(raw, bucket, SCOPE + id, "evil".getBytes(StandardCharsets.UTF_8));
      Throwable e = failure(m.get(id, new ByteArrayOutputStream(), md("x", -1)));
      assertKind(SamzaException.class, e);
      assertTrue(e.getMessage().contains("corrupt"), e.getMessage());
      // A PUT of the real bytes meets the foreign object (412) and refuses to call it ours.
      Path f = checkpointFile(CID, "CURRENT", good);
      Throwable p = failure(m.put(new ByteArrayInputStream(good), md(f.toString(), good.length)));
      assertKind(SamzaException.class, p);
      assertTrue(p.getMessage().contains("exists with other bytes"), p.getMessage());

      // An index blobsnap wrote with inline files (format-version 2) is not for Samza's engine.
      byte[] v2 = ("{\"format-version\":2,\"creation-time-millis\":1,\"snapshot-metadata\":{\"checkpoint-id\":\"" + CID
          + "\",\"job-name\":\"word.count\",\"job-id\":\"1\",\"task-name\":\"Partition 0\",\"store-name\":\"counts\"},"
          + "\"dir-index\":{\"dir-name\":\"\",\"files-present\":[],\"files-removed\":[],\"sub-dirs-present\":[],"
          + "\"sub-dirs-removed\":[]},\"prev-snapshot-index-blob-id\":null}").getBytes(StandardCharsets.UTF_8);
      String marker = "index/" + CID + "." + sha(v2) + ".json";
      S3Test.putRaw(raw, bucket, SCOPE + marker, v2);
      Throwable x = failure(m.get(marker, new ByteArrayOutputStream(), md(Metadata.SNAPSHOT_INDEX_PAYLOAD_PATH, -1)));
      assertKind(SamzaException.class, x);
      assertTrue(x.getMessage().contains("format-version 2"), x.getMessage());

      // A file outside any checkpoint dir: no checkpoint id, a clear error.
      Path loose = tmp.resolve("loose.sst");
      Files.write(loose, good);
      Throwable l = failure(m.put(new ByteArrayInputStream(good), md(loose.toString(), good.length)));
      assertKind(SamzaException.class, l);
      assertTrue(l.getMessage().contains("cannot tell the checkpoint id"), l.getMessage());
    } finally {
      m.close();
    }
  }

  @Test
  void ignoredCreateOnlyLooksFirst() throws Exception {
    S3BlobStoreManager m = manager(S3Test.settings(bucket, "ignored/").createOnly(S3Settings.CreateOnly.IGNORED));
    try {
      byte[] bytes = randomBytes(1000, 3);
      Path f = checkpointFile(CID, "000013.sst", bytes);
      String id = join(m.put(new ByteArrayInputStream(bytes), md(f.toString(), bytes.length)));
      String key = "ignored/word%2Ecount/1/tasks/Partition%200/stores/counts/" + id;
      S3Object before = S3Test.list(raw, bucket, key).get(0);
      Thread.sleep(1100);
      assertEquals(id, join(m.put(new ByteArrayInputStream(bytes), md(f.toString(), bytes.length))));
      S3Object after = S3Test.list(raw, bucket, key).get(0);
      assertEquals(before.lastModified(), after.lastModified(), "a blob is never written twice");
    } finally {
      m.close();
    }
  }

  @Test
  void serverDownIsRetriable() throws Exception {
    int port;
    try (ServerSocket s = new ServerSocket(0, 1, java.net.InetAddress.getLoopbackAddress())) {
      port = s.getLocalPort();
    }
    S3BlobStoreManager m = manager(S3Settings.builder().bucket(bucket).endpoint(URI.create("http://127.0.0.1:" + port))
        .region("us-east-1").pathStyle(true).connectTimeoutMs(1000));
    try {
      Throwable g = failure(m.get("blobs/" + CID + "/" + sha(new byte[0]), new ByteArrayOutputStream(), md("x", -1)));
      assertKind(RetriableException.class, g);
      assertTrue(g.getMessage().contains("127.0.0.1:" + port) || g.getMessage().contains("blobs/" + CID),
          g.getMessage());
      byte[] bytes = "x".getBytes(StandardCharsets.UTF_8);
      Path f = checkpointFile(CID, "LOG", bytes);
      assertKind(RetriableException.class, failure(m.put(new ByteArrayInputStream(bytes),
          md(f.toString(), bytes.length))));
    } finally {
      m.close();
    }
  }

  @Test
  void closedManagerFailsItsFutures() throws Exception {
    S3BlobStoreManager m = manager();
    m.close();
    m.close();
    InputStream in = new ByteArrayInputStream(new byte[0]);
    assertKind(SamzaException.class, failure(m.put(in, md("x", 0))));
  }

  @Test
  void keysOfTheBucketAreOnlyTheLayoutsShapes() throws Exception {
    fileRoundTripWithExactKeyAndSamzasCrc();
    List<String> keys = S3Test.list(raw, bucket, "t/").stream().map(S3Object::key).collect(Collectors.toList());
    assertNotNull(keys);
    for (String k : keys) {
      assertTrue(k.startsWith(SCOPE), k);
      Layout.parseId(k.substring(SCOPE.length()));
    }
  }
}
