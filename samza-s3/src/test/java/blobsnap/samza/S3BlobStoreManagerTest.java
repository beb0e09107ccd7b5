package blobsnap.samza;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
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
  static final String OWNER_RECORD = "t/word%2Ecount/1/scope.json";

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
      // An index never stored is committed into no history.
      assertTrue(S3Test.list(raw, bucket, "t/word%2Ecount/1/checkpoints/").isEmpty());

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
    assertTrue(keys.contains(OWNER_RECORD), keys.toString());
    for (String k : keys) {
      if (k.equals(OWNER_RECORD) || S3Test.isHistoryRecord("t/word%2Ecount/1/", k)) {
        continue;
      }
      assertTrue(k.startsWith(SCOPE), k);
      Layout.parseId(k.substring(SCOPE.length()));
    }
  }

  // ---- the owner record ----

  static final String OWNER_JSON = "{\"deployment-id\":\"samza-blob-store\",\"job-name\":\"word.count\","
      + "\"job-id\":\"1\",\"engine\":\"samza-blob-store\",\"history\":\"prepared\"}";

  static S3Object object(String key) {
    List<S3Object> found = S3Test.list(raw, bucket, key);
    assertEquals(1, found.size(), key + ": " + found);
    assertEquals(key, found.get(0).key());
    return found.get(0);
  }

  @Test
  void theFirstPutIntoAJobScopeWritesItsOwnerRecord() throws Exception {
    String prefix = "owner/";
    String record = prefix + "word%2Ecount/1/scope.json";
    assertEquals(record, Layout.ownerRecordKey(prefix, JOB, JOB_ID));
    assertTrue(S3Test.list(raw, bucket, prefix).isEmpty());
    S3BlobStoreManager m = manager(S3Test.settings(bucket, prefix));
    S3BlobStoreManager second = manager(S3Test.settings(bucket, prefix));
    S3Object written;
    try {
      byte[] bytes = randomBytes(2000, 21);
      Path f = checkpointFile(CID, "000021.sst", bytes);
      String id = join(m.put(new ByteArrayInputStream(bytes), md(f.toString(), bytes.length)));
      // Exactly blobsnap's ScopeRecord, names unescaped, engine Samza's blob-store engine.
      byte[] json = S3Test.getRaw(raw, bucket, record);
      assertEquals(OWNER_JSON, new String(json, StandardCharsets.UTF_8));
      JsonNode root = new ObjectMapper().readTree(json);
      List<String> fields = new ArrayList<>();
      root.fieldNames().forEachRemaining(fields::add);
      assertEquals(java.util.Arrays.asList("deployment-id", "job-name", "job-id", "engine", "history"), fields);
      assertEquals("samza-blob-store", root.path("deployment-id").asText());
      assertEquals(JOB, root.path("job-name").asText());
      assertEquals(JOB_ID, root.path("job-id").asText());
      assertEquals(S3BlobStoreManager.ENGINE, root.path("engine").asText());
      assertEquals("application/json", raw.headObject(b -> b.bucket(bucket).key(record)).contentType());
      written = object(record);
      assertArrayEquals(bytes, S3Test.getRaw(raw, bucket, prefix + "word%2Ecount/1/tasks/Partition%200/stores/counts/"
          + id));

      // A second manager of the process (same settings: the same transport and its set of
      // scopes already ensured) puts an index into the same scope.
      byte[] index = new SnapshotIndexSerde().toBytes(index(CID, Collections.emptyList()));
      join(second.put(new ByteArrayInputStream(index), md(Metadata.SNAPSHOT_INDEX_PAYLOAD_PATH, index.length)));
    } finally {
      m.close();
      second.close();
    }
    Thread.sleep(1100);
    // A fresh process (the transport and its set are gone with the last close): the record is
    // there (412), read and found Samza's engine's: the put succeeds, the record is not rewritten.
    S3BlobStoreManager fresh = manager(S3Test.settings(bucket, prefix));
    // and one on a server that ignores If-None-Match: it looks first (HEAD), then reads it.
    S3BlobStoreManager looks = manager(S3Test.settings(bucket, prefix).createOnly(S3Settings.CreateOnly.IGNORED));
    try {
      for (S3BlobStoreManager x : new S3BlobStoreManager[] {fresh, looks}) {
        byte[] bytes = randomBytes(100, x == fresh ? 22 : 23);
        Path f = checkpointFile(CID, "00002" + (x == fresh ? 2 : 3) + ".sst", bytes);
        assertEquals("blobs/" + CID + "/" + sha(bytes), join(x.put(new ByteArrayInputStream(bytes),
            md(f.toString(), bytes.length))));
      }
    } finally {
      fresh.close();
      looks.close();
    }
    S3Object after = object(record);
    assertEquals(written.lastModified(), after.lastModified(), "the owner record is never rewritten");
    assertEquals(written.eTag(), after.eTag());
    assertEquals(OWNER_JSON, new String(S3Test.getRaw(raw, bucket, record), StandardCharsets.UTF_8));
  }

  /**
   * A job scope whose owner record a samza-s3 from before the history wrote (no
   * {@code "history"}): blobsnap's sweep refuses it until every task with snapshots has a
   * checkpoint in blobsnap's history; the commit that finds so makes the record say
   * {@code "history": "prepared"}.
   */
  @Test
  void anOwnerRecordFromBeforeTheHistoryGetsItOnceEveryTaskHasOne() throws Exception {
    String prefix = "legacy/";
    String record = prefix + "word%2Ecount/1/scope.json";
    String old = "{\"deployment-id\":\"samza-blob-store\",\"job-name\":\"word.count\",\"job-id\":\"1\","
        + "\"engine\":\"samza-blob-store\"}";
    S3Test.putRaw(raw, bucket, record, old.getBytes(StandardCharsets.UTF_8));
    byte[] index = emptyIndex(1L, CID, JOB, JOB_ID, STORE);
    Metadata idx = new Metadata(Metadata.SNAPSHOT_INDEX_PAYLOAD_PATH, Optional.of((long) index.length), JOB, JOB_ID,
        TASK, STORE);
    S3BlobStoreManager m = manager(S3Test.settings(bucket, prefix));
    try {
      String marker = join(m.put(new ByteArrayInputStream(index), idx));
      assertEquals(old, new String(S3Test.getRaw(raw, bucket, record), StandardCharsets.UTF_8),
          "the index's put leaves the record");
      String prepared = prefix + "word%2Ecount/1/prepared/Partition%200/" + CID + ".counts.json";
      assertNotNull(object(prepared));
      // Another task of the job has snapshots and no history yet (a container still on the old
      // samza-s3): its restart point is rooted by nothing, so the record stays as it was.
      String other = prefix + "word%2Ecount/1/tasks/Partition%201/stores/counts/blobs/" + CID + "/"
          + sha(new byte[] {1});
      S3Test.putRaw(raw, bucket, other, new byte[] {1});
      join(m.removeTTL(marker, idx));
      assertEquals(old, new String(S3Test.getRaw(raw, bucket, record), StandardCharsets.UTF_8),
          "a task without a history keeps the sweep out");
      // Once it has one, the next commit lets the sweep in.
      S3Test.putRaw(raw, bucket, prefix + "word%2Ecount/1/checkpoints/Partition%201/00000000000000000001.json",
          new byte[] {'{', '}'});
      String cid2 = "1700000000124-0";
      byte[] index2 = emptyIndex(2L, cid2, JOB, JOB_ID, STORE);
      Metadata idx2 = new Metadata(Metadata.SNAPSHOT_INDEX_PAYLOAD_PATH, Optional.of((long) index2.length), JOB,
          JOB_ID, TASK, STORE);
      String marker2 = join(m.put(new ByteArrayInputStream(index2), idx2));
      join(m.removeTTL(marker2, idx2));
      JsonNode r = new ObjectMapper().readTree(S3Test.getRaw(raw, bucket, record));
      assertEquals("prepared", r.path("history").asText(), r.toString());
      assertEquals(S3BlobStoreManager.ENGINE, r.path("engine").asText(), r.toString());
      JsonNode doc = new ObjectMapper().readTree(S3Test.getRaw(raw, bucket,
          prefix + "word%2Ecount/1/checkpoints/Partition%200/00000000000000000002.json"));
      assertEquals(marker2, doc.path("checkpoint").path("state-checkpoint-markers").path(History.FACTORY)
          .path(STORE).asText(), doc.toString());
      assertTrue(S3Test.list(raw, bucket, prefix + "word%2Ecount/1/prepared/").isEmpty(), "the record is dropped");
    } finally {
      m.close();
    }
  }

  /**
   * A checkpoint of two stores is committed into blobsnap's history once both indexes' TTLs are
   * removed, as one document naming both; a retried removeTTL commits nothing more.
   */
  @Test
  void everyStoreOfACheckpointIsCommittedTogetherAndARetryCommitsNothing() throws Exception {
    String prefix = "two/";
    String jobScope = prefix + "word%2Ecount/1/";
    S3BlobStoreManager m = manager(S3Test.settings(bucket, prefix));
    try {
      java.util.Map<String, String> markers = new java.util.TreeMap<>();
      java.util.Map<String, Metadata> mds = new java.util.TreeMap<>();
      for (String store : new String[] {"counts", "totals"}) {
        byte[] index = emptyIndex(1L, CID, JOB, JOB_ID, store);
        Metadata idx = new Metadata(Metadata.SNAPSHOT_INDEX_PAYLOAD_PATH, Optional.of((long) index.length), JOB,
            JOB_ID, TASK, store);
        markers.put(store, join(m.put(new ByteArrayInputStream(index), idx)));
        mds.put(store, idx);
      }
      String docs = jobScope + "checkpoints/Partition%200/";
      join(m.removeTTL(markers.get("counts"), mds.get("counts")));
      assertTrue(S3Test.list(raw, bucket, docs).isEmpty(), "one store's removeTTL commits nothing");
      join(m.removeTTL(markers.get("totals"), mds.get("totals")));
      join(m.removeTTL(markers.get("totals"), mds.get("totals"))); // Samza's retry
      List<S3Object> written = S3Test.list(raw, bucket, docs);
      assertEquals(1, written.size(), written.toString());
      JsonNode doc = new ObjectMapper().readTree(S3Test.getRaw(raw, bucket, written.get(0).key()));
      JsonNode named = doc.path("checkpoint").path("state-checkpoint-markers").path(History.FACTORY);
      assertEquals(markers.get("counts"), named.path("counts").asText(), doc.toString());
      assertEquals(markers.get("totals"), named.path("totals").asText(), doc.toString());
      assertTrue(S3Test.list(raw, bucket, jobScope + "prepared/").isEmpty(), "the records are dropped");
    } finally {
      m.close();
    }
  }

  /** The bytes of an empty snapshot index of Samza's shape for {@code store} at {@code cid}. */
  static byte[] emptyIndex(long created, String cid, String job, String jobId, String store) {
    return new SnapshotIndexSerde().toBytes(new SnapshotIndex(created, new SnapshotMetadata(
        CheckpointId.deserialize(cid), job, jobId, TASK, store), new DirIndex(DirIndex.ROOT_DIR_NAME,
        Collections.emptyList(), Collections.emptyList(), Collections.emptyList(), Collections.emptyList()),
        Optional.empty()));
  }

  @Test
  void aJobScopeOwnedByABlobsnapDeploymentIsRefused() throws Exception {
    String prefix = "foreign/";
    String record = prefix + "j/1/scope.json";
    byte[] blobsnaps = "{\"deployment-id\":\"d1\",\"job-name\":\"j\",\"job-id\":\"1\"}".getBytes(StandardCharsets.UTF_8);
    S3Test.putRaw(raw, bucket, record, blobsnaps);
    byte[] bytes = randomBytes(500, 31);
    Path f = checkpointFile(CID, "000031.sst", bytes);
    Metadata file = new Metadata(f.toString(), Optional.of((long) bytes.length), "j", "1", TASK, STORE);
    byte[] index = emptyIndex(1L, CID, "j", "1", STORE);
    Metadata idx = new Metadata(Metadata.SNAPSHOT_INDEX_PAYLOAD_PATH, Optional.of((long) index.length), "j", "1",
        TASK, STORE);
    for (S3Settings.CreateOnly mode : new S3Settings.CreateOnly[] {S3Settings.CreateOnly.AUTO,
        S3Settings.CreateOnly.IGNORED}) {
      S3BlobStoreManager m = manager(S3Test.settings(bucket, prefix).createOnly(mode));
      try {
        // Twice: a refusal is not remembered as an ensured scope.
        for (int i = 0; i < 2; i++) {
          Throwable e = failure(m.put(new ByteArrayInputStream(bytes), file));
          assertKind(SamzaException.class, e);
          if (i == 0) {
            System.err.println("[S3BlobStoreManagerTest] create-only " + mode + ", refused: " + e.getMessage());
          }
          assertTrue(e.getMessage().contains("s3://" + bucket + "/" + record), e.getMessage());
          assertTrue(e.getMessage().contains("belongs to another deployment or engine"), e.getMessage());
          assertTrue(e.getMessage().contains("\"d1\""), e.getMessage());
          assertTrue(e.getMessage().contains("use another job id") || e.getMessage().contains("Use another job id"),
              e.getMessage());
        }
        Throwable e = failure(m.put(new ByteArrayInputStream(index), idx));
        assertKind(SamzaException.class, e);
        assertTrue(e.getMessage().contains("scope.json"), e.getMessage());
      } finally {
        m.close();
      }
    }
    // Nothing was written: no blob, no index, the record as it was.
    assertEquals(Collections.singletonList(record), S3Test.list(raw, bucket, prefix).stream().map(S3Object::key)
        .collect(Collectors.toList()));
    assertArrayEquals(blobsnaps, S3Test.getRaw(raw, bucket, record));

    // Another engine's record, and an unreadable one, are refused the same way.
    for (String other : new String[] {"{\"deployment-id\":\"x\",\"job-name\":\"j\",\"job-id\":\"2\",\"engine\":\"other\"}",
        "not json", "[\"samza-blob-store\"]"}) {
      String key = prefix + "j/2/scope.json";
      S3Test.putRaw(raw, bucket, key, other.getBytes(StandardCharsets.UTF_8));
      S3BlobStoreManager m = manager(S3Test.settings(bucket, prefix));
      try {
        Throwable e = failure(m.put(new ByteArrayInputStream(bytes), new Metadata(f.toString(),
            Optional.of((long) bytes.length), "j", "2", TASK, STORE)));
        assertKind(SamzaException.class, e);
        assertTrue(e.getMessage().contains(key) && e.getMessage().contains("another deployment or engine"),
            other + ": " + e.getMessage());
      } finally {
        m.close();
      }
      assertEquals(Collections.singletonList(key), S3Test.list(raw, bucket, prefix + "j/2/").stream()
          .map(S3Object::key).collect(Collectors.toList()));
    }
  }
}
