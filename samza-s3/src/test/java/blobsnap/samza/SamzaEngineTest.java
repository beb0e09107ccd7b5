package blobsnap.samza;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.TreeMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.regex.Pattern;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.apache.samza.Partition;
import org.apache.samza.checkpoint.CheckpointId;
import org.apache.samza.checkpoint.CheckpointV2;
import org.apache.samza.config.Config;
import org.apache.samza.config.MapConfig;
import org.apache.samza.container.TaskName;
import org.apache.samza.context.JobContext;
import org.apache.samza.context.JobContextImpl;
import org.apache.samza.job.model.ContainerModel;
import org.apache.samza.job.model.JobModel;
import org.apache.samza.job.model.TaskModel;
import org.apache.samza.metrics.MetricsRegistryMap;
import org.apache.samza.serializers.CheckpointV2Serde;
import org.apache.samza.storage.TaskBackupManager;
import org.apache.samza.storage.TaskRestoreManager;
import org.apache.samza.storage.blobstore.BlobStoreStateBackendFactory;
import org.apache.samza.util.SystemClock;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import software.amazon.awssdk.services.s3.S3Client;
import software.amazon.awssdk.services.s3.model.S3Object;

/**
 * The key proof of route 2: Samza 1.8.0's OWN blob-store engine — its
 * {@code BlobStoreStateBackendFactory}, which instantiates our factory from
 * {@code blob.store.manager.factory}, its {@code BlobStoreBackupManager} (DirDiff, putDir,
 * SnapshotIndex, cleanUp with removeTTL and deletes) and its {@code BlobStoreRestoreManager}
 * (getSnapshotIndex, restoreDir, post-restore verification) — backs up real checkpoint dirs
 * through {@link S3BlobStoreManager} into blobsnap's layout on a real S3 server, then restores
 * them into new dirs, byte for byte. It leaves the bucket listing, both indexes and the
 * CheckpointV2 Samza would store under {@code target/evidence/} for the Rust side.
 */
class SamzaEngineTest {
  static final String JOB = "word.count";
  static final String TASK = "Partition 0";
  static final String STORE = "counts";
  static final String PREFIX = "samza/";
  static final String SCOPE = PREFIX + "word%2Ecount/1/tasks/Partition%200/stores/counts/";
  static final String FACTORY = BlobStoreStateBackendFactory.class.getName();
  static final Pattern MARKER = Pattern.compile("index/[0-9]+-[0-9]+\\.[0-9a-f]{64}\\.json");

  static S3Client raw;
  static String bucket;
  static ExecutorService commitPool;
  static ExecutorService restorePool;

  @TempDir
  Path tmp;

  @BeforeAll
  static void setUp() {
    raw = S3Test.rawClient();
    bucket = S3Test.newBucket(raw, "engine");
    commitPool = pool("Samza Task Commit Thread-");
    restorePool = pool("Samza Restore Thread-");
  }

  static ExecutorService pool(String name) {
    AtomicInteger n = new AtomicInteger();
    return Executors.newFixedThreadPool(2, r -> new Thread(r, name + n.incrementAndGet()));
  }

  @AfterAll
  static void tearDown() throws InterruptedException {
    for (ExecutorService p : new ExecutorService[] {commitPool, restorePool}) {
      if (p != null) {
        p.shutdown();
        p.awaitTermination(5, TimeUnit.SECONDS);
      }
    }
    if (raw != null) {
      raw.close();
    }
  }

  static Config config() {
    Map<String, String> c = new HashMap<>();
    c.put("job.name", JOB);
    c.put("job.id", "1");
    c.put("stores." + STORE + ".factory", "org.apache.samza.storage.kv.RocksDbKeyValueStorageEngineFactory");
    c.put("stores." + STORE + ".backup.factories", FACTORY);
    c.put("stores." + STORE + ".restore.factories", FACTORY);
    c.put("blob.store.manager.factory", S3BlobStoreManagerFactory.class.getName());
    c.put(S3Settings.BUCKET, bucket);
    c.put(S3Settings.PREFIX, PREFIX);
    c.put(S3Settings.ENDPOINT, S3Test.endpoint().toString());
    c.put(S3Settings.REGION, S3Test.region());
    c.put(S3Settings.PATH_STYLE, "true");
    c.put(S3Settings.MAX_TRANSFERS, "4");
    return new MapConfig(c);
  }

  static byte[] random(int n, long seed) {
    byte[] b = new byte[n];
    new Random(seed).nextBytes(b);
    return b;
  }

  static void write(Path f, byte[] bytes) throws IOException {
    Files.createDirectories(f.getParent());
    Files.write(f, bytes);
  }

  /** Every regular file under {@code dir} by relative path, with its bytes; and every dir. */
  static Map<String, byte[]> tree(Path dir) throws IOException {
    Map<String, byte[]> out = new TreeMap<>();
    try (Stream<Path> s = Files.walk(dir)) {
      for (Path p : s.collect(Collectors.toList())) {
        String rel = dir.relativize(p).toString();
        if (Files.isDirectory(p)) {
          out.put(rel + "/", new byte[0]);
        } else {
          out.put(rel, Files.readAllBytes(p));
        }
      }
    }
    return out;
  }

  static void assertSameTree(Path expected, Path actual) throws IOException {
    Map<String, byte[]> e = tree(expected);
    Map<String, byte[]> a = tree(actual);
    assertEquals(e.keySet(), a.keySet(), "restored tree of " + actual);
    for (String k : e.keySet()) {
      assertArrayEquals(e.get(k), a.get(k), k);
    }
  }

  static String sha(Path f) throws IOException {
    return S3BlobStoreManager.hex(S3BlobStoreManager.sha256().digest(Files.readAllBytes(f)));
  }

  /** Each present file of an index (path → blob id), recursively. */
  static void blobIds(JsonNode dir, String prefix, Map<String, String> out) {
    for (JsonNode f : dir.path("files-present")) {
      assertEquals(1, f.path("blobs").size(), "Samza writes one blob per file");
      out.put(prefix + f.path("file-name").asText(), f.path("blobs").get(0).path("blob-id").asText());
    }
    for (JsonNode d : dir.path("sub-dirs-present")) {
      blobIds(d, prefix + d.path("dir-name").asText() + "/", out);
    }
  }

  @Test
  void samzasEngineBacksUpAndRestoresThroughBlobsnapsLayout() throws Exception {
    Config config = config();
    TaskName taskName = new TaskName(TASK);
    TaskModel taskModel = new TaskModel(taskName, Collections.emptySet(), new Partition(0));
    ContainerModel container = new ContainerModel("0", Collections.singletonMap(taskName, taskModel));
    JobModel jobModel = new JobModel(config, Collections.singletonMap("0", container));
    JobContext jobContext = JobContextImpl.fromConfigWithDefaults(config, jobModel);
    BlobStoreStateBackendFactory samza = new BlobStoreStateBackendFactory();

    Path base = tmp.resolve("state");
    Path nonLogged = tmp.resolve("non-logged");
    Files.createDirectories(nonLogged);

    // ---- commit 1: a checkpoint dir as RocksDB's checkpoint makes it, plus the odd cases ----
    CheckpointId cid1 = CheckpointId.create();
    Path cp1 = base.resolve(STORE).resolve("Partition_0-" + cid1.serialize());
    write(cp1.resolve("000010.sst"), random((2 << 20) + 17, 10)); // over 1 MiB: Samza's diff skips its CRC
    write(cp1.resolve("000011.sst"), random(300_000, 11));
    write(cp1.resolve("CURRENT"), "MANIFEST-000005\n".getBytes(StandardCharsets.UTF_8));
    write(cp1.resolve("MANIFEST-000005"), random(4096, 5));
    write(cp1.resolve("OPTIONS-000007"), "[Version]\n  rocksdb_version=7.0.3\n".getBytes(StandardCharsets.UTF_8));
    write(cp1.resolve("EMPTY-1"), new byte[0]); // two empty files: one blob
    write(cp1.resolve("EMPTY-2"), new byte[0]);
    write(cp1.resolve("dup-a"), random(10_000, 7)); // two identical files: one key, PUT concurrently
    write(cp1.resolve("dup-b"), random(10_000, 7));
    write(cp1.resolve("blob_dir/nested/000001.blob"), random(50_000, 1));
    Files.createDirectories(cp1.resolve("empty_dir"));

    TaskBackupManager backup = samza.getBackupManager(jobContext, container, taskModel, Collections.emptyMap(),
        commitPool, new MetricsRegistryMap(), config, SystemClock.instance(), base.toFile(), nonLogged.toFile());
    backup.init(null);
    assertEquals(Collections.emptyMap(), backup.snapshot(cid1));
    Map<String, String> scm1 = backup.upload(cid1, Collections.emptyMap()).get(120, TimeUnit.SECONDS);
    String marker1 = scm1.get(STORE);
    assertTrue(MARKER.matcher(marker1).matches(), marker1);
    assertTrue(marker1.startsWith("index/" + cid1.serialize() + "."), marker1);
    byte[] index1 = S3Test.getRaw(raw, bucket, SCOPE + marker1);
    assertEquals("index/" + cid1.serialize() + "." + S3BlobStoreManager.hex(S3BlobStoreManager.sha256().digest(index1))
        + ".json", marker1, "the marker names the SHA-256 of the index's exact bytes");
    JsonNode root1 = new ObjectMapper().readTree(index1);
    assertEquals(cid1.serialize(), root1.path("snapshot-metadata").path("checkpoint-id").asText());
    assertTrue(root1.path("prev-snapshot-index-blob-id").isNull());
    Map<String, String> ids1 = new TreeMap<>();
    blobIds(root1.path("dir-index"), "", ids1);
    assertEquals(10, ids1.size(), ids1.toString());
    for (Map.Entry<String, String> e : ids1.entrySet()) {
      // Every blob id is scope-relative and content-addressed: blobs/<checkpoint-id>/<sha256 of the file>.
      assertEquals("blobs/" + cid1.serialize() + "/" + sha(cp1.resolve(e.getKey())), e.getValue(), e.getKey());
    }
    assertEquals(ids1.get("dup-a"), ids1.get("dup-b"));
    assertEquals(ids1.get("EMPTY-1"), ids1.get("EMPTY-2"));

    // The commit point Samza would write (here: as its serde writes it), then its cleanUp.
    CheckpointV2 checkpoint1 = new CheckpointV2(cid1, Collections.emptyMap(),
        Collections.singletonMap(FACTORY, scm1));
    backup.cleanUp(cid1, scm1).get(120, TimeUnit.SECONDS);

    // ---- commit 2: files changed, removed, added; large file retained ----
    CheckpointId cid2 = CheckpointId.create();
    while (cid2.serialize().equals(cid1.serialize())) {
      cid2 = CheckpointId.create();
    }
    Path cp2 = base.resolve(STORE).resolve("Partition_0-" + cid2.serialize());
    copyTree(cp1, cp2);
    Files.delete(cp2.resolve("000011.sst"));
    Files.delete(cp2.resolve("OPTIONS-000007"));
    write(cp2.resolve("000012.sst"), random(400_000, 12));
    write(cp2.resolve("OPTIONS-000009"), "[Version]\n  rocksdb_version=7.0.3\n#2\n".getBytes(StandardCharsets.UTF_8));
    write(cp2.resolve("CURRENT"), "MANIFEST-000008\n".getBytes(StandardCharsets.UTF_8));
    Files.delete(cp2.resolve("MANIFEST-000005"));
    write(cp2.resolve("MANIFEST-000008"), random(5000, 8));
    Map<String, String> scm2 = backup.upload(cid2, Collections.emptyMap()).get(120, TimeUnit.SECONDS);
    String marker2 = scm2.get(STORE);
    assertTrue(MARKER.matcher(marker2).matches(), marker2);
    byte[] index2 = S3Test.getRaw(raw, bucket, SCOPE + marker2);
    JsonNode root2 = new ObjectMapper().readTree(index2);
    assertEquals(marker1, root2.path("prev-snapshot-index-blob-id").asText());
    Map<String, String> ids2 = new TreeMap<>();
    blobIds(root2.path("dir-index"), "", ids2);
    // Retained files keep the blob of the checkpoint that first uploaded them; new ones get cid2's.
    assertEquals(ids1.get("000010.sst"), ids2.get("000010.sst"));
    assertEquals(ids1.get("blob_dir/nested/000001.blob"), ids2.get("blob_dir/nested/000001.blob"));
    assertEquals("blobs/" + cid2.serialize() + "/" + sha(cp2.resolve("000012.sst")), ids2.get("000012.sst"));
    assertEquals("blobs/" + cid2.serialize() + "/" + sha(cp2.resolve("CURRENT")), ids2.get("CURRENT"));
    assertFalse(ids2.containsKey("000011.sst"));
    CheckpointV2 checkpoint2 = new CheckpointV2(cid2, Collections.emptyMap(),
        Collections.singletonMap(FACTORY, scm2));
    // Before its cleanUp, checkpoint 2 is prepared (a root for blobsnap's sweep), checkpoint 1 is
    // in blobsnap's history.
    String jobScope = PREFIX + "word%2Ecount/1/";
    String prepared2 = jobScope + "prepared/Partition%200/" + cid2.serialize() + ".counts.json";
    String doc1 = jobScope + "checkpoints/Partition%200/00000000000000000001.json";
    String doc2 = jobScope + "checkpoints/Partition%200/00000000000000000002.json";
    JsonNode rec2 = new ObjectMapper().readTree(S3Test.getRaw(raw, bucket, prepared2));
    assertEquals(cid2.serialize(), rec2.path("checkpoint-id").asText(), rec2.toString());
    assertEquals(marker2, rec2.path("state-checkpoint-markers").path(History.FACTORY).path(STORE).asText(),
        rec2.toString());
    JsonNode d1 = new ObjectMapper().readTree(S3Test.getRaw(raw, bucket, doc1));
    assertEquals(1, d1.path("seq").asInt(), d1.toString());
    assertEquals(marker1, d1.path("checkpoint").path("state-checkpoint-markers").path(History.FACTORY).path(STORE)
        .asText(), d1.toString());
    // Samza's cleanUp deletes the removed files' blobs and the previous index: deferred, all kept.
    backup.cleanUp(cid2, scm2).get(120, TimeUnit.SECONDS);
    backup.close();
    List<String> keys = S3Test.list(raw, bucket, PREFIX).stream().map(S3Object::key).collect(Collectors.toList());
    // Checkpoint 2 committed into blobsnap's history after Samza's write; no prepared record left.
    assertTrue(keys.contains(doc1) && keys.contains(doc2), keys.toString());
    assertFalse(keys.stream().anyMatch(k -> k.startsWith(jobScope + "prepared/")), keys.toString());
    JsonNode d2 = new ObjectMapper().readTree(S3Test.getRaw(raw, bucket, doc2));
    assertEquals(cid2.serialize(), d2.path("checkpoint").path("checkpoint-id").asText(), d2.toString());
    assertEquals(marker2, d2.path("checkpoint").path("state-checkpoint-markers").path(History.FACTORY).path(STORE)
        .asText(), d2.toString());
    assertTrue(keys.contains(SCOPE + marker1), "the previous index survives Samza's cleanup");
    assertTrue(keys.contains(SCOPE + ids1.get("000011.sst")), "a removed file's blob survives Samza's cleanup");
    // The job scope's owner record, naming Samza's engine, blobsnap's history, and the store's
    // blobs and indexes: nothing else.
    String owner = PREFIX + "word%2Ecount/1/scope.json";
    assertTrue(keys.contains(owner), keys.toString());
    assertEquals(S3BlobStoreManager.ENGINE, new ObjectMapper().readTree(S3Test.getRaw(raw, bucket, owner))
        .path("engine").asText());
    for (String k : keys) {
      if (k.equals(owner) || S3Test.isHistoryRecord(jobScope, k)) {
        continue;
      }
      assertTrue(k.startsWith(SCOPE), k);
      Layout.parseId(k.substring(SCOPE.length()));
    }

    // ---- restore the latest checkpoint with Samza's restore manager, into a new host dir ----
    Path base2 = tmp.resolve("state-restored");
    restore(samza, jobContext, taskModel, config, base2, nonLogged, checkpoint2);
    assertSameTree(cp2, base2.resolve(STORE).resolve("Partition_0"));

    // ---- and the previous one: history survives because deletes are deferred ----
    Path base3 = tmp.resolve("state-restored-1");
    restore(samza, jobContext, taskModel, config, base3, nonLogged, checkpoint1);
    assertSameTree(cp1, base3.resolve(STORE).resolve("Partition_0"));

    // ---- evidence for the Rust side ----
    Path ev = S3Test.evidenceDir();
    Files.createDirectories(ev);
    List<String> listing = new ArrayList<>();
    listing.add("# s3://" + bucket + "/" + PREFIX + " after two commits of Samza 1.8.0's blob-store engine through"
        + " blobsnap.samza.S3BlobStoreManager (key<TAB>size; the job scope's owner record scope.json first)");
    for (S3Object o : S3Test.list(raw, bucket, PREFIX)) {
      listing.add(o.key() + "\t" + o.size());
    }
    Files.write(ev.resolve("bucket-listing.txt"), listing, StandardCharsets.UTF_8);
    Files.write(ev.resolve("index-commit-1.json"), index1);
    Files.write(ev.resolve("index-commit-2.json"), index2);
    Files.write(ev.resolve("checkpoint-v2-commit-2.json"), new CheckpointV2Serde().toBytes(checkpoint2));
    List<String> notes = new ArrayList<>();
    notes.add("scope\t" + SCOPE);
    notes.add("marker-1\t" + marker1);
    notes.add("marker-2\t" + marker2);
    notes.add("index-key-2\t" + SCOPE + marker2);
    for (Map.Entry<String, String> e : ids2.entrySet()) {
      notes.add("blob-id-2\t" + e.getKey() + "\t" + e.getValue());
    }
    Files.write(ev.resolve("markers.tsv"), notes, StandardCharsets.UTF_8);
  }

  /**
   * Pins a trap of Samza 1.8.0 (not of this manager): its restore init drops a store whose index
   * GET fails with DeletedException ({@code BlobStoreUtil.getStoreSnapshotIndexes} ignores it),
   * so the store is silently NOT restored and the task starts with empty state. The manager
   * answers a missing index with DeletedException as the SPI asks; this is why nothing may
   * delete an index a checkpoint still names (README.md: blobsnap gc refuses a scope whose
   * owner record names Samza's engine, until Samza's commits are recorded as roots).
   */
  @Test
  void samza180SilentlySkipsAStoreWhoseIndexIsMissing() throws Exception {
    Config config = config();
    TaskName taskName = new TaskName(TASK);
    TaskModel taskModel = new TaskModel(taskName, Collections.emptySet(), new Partition(0));
    ContainerModel container = new ContainerModel("0", Collections.singletonMap(taskName, taskModel));
    JobContext jobContext = JobContextImpl.fromConfigWithDefaults(config,
        new JobModel(config, Collections.singletonMap("0", container)));
    CheckpointId cid = CheckpointId.create();
    String missing = "index/" + cid.serialize() + "." + S3BlobStoreManager.hex(S3BlobStoreManager.sha256()
        .digest("never written".getBytes(StandardCharsets.UTF_8))) + ".json";
    CheckpointV2 checkpoint = new CheckpointV2(cid, Collections.emptyMap(),
        Collections.singletonMap(FACTORY, Collections.singletonMap(STORE, missing)));
    Path base = tmp.resolve("state-missing");
    Path nonLogged = tmp.resolve("non-logged-missing");
    Files.createDirectories(nonLogged);
    restore(new BlobStoreStateBackendFactory(), jobContext, taskModel, config, base, nonLogged, checkpoint);
    assertFalse(Files.exists(base.resolve(STORE).resolve("Partition_0")),
        "Samza 1.8.0 restored nothing and reported no error for a checkpoint whose index is missing");
  }

  static void restore(BlobStoreStateBackendFactory samza, JobContext jobContext, TaskModel taskModel, Config config,
      Path base, Path nonLogged, CheckpointV2 checkpoint) throws Exception {
    Files.createDirectories(base);
    TaskRestoreManager restore = samza.getRestoreManager(jobContext, null, taskModel, restorePool,
        new MetricsRegistryMap(), Collections.singleton(STORE), config, SystemClock.instance(), base.toFile(),
        nonLogged.toFile(), null);
    restore.init(checkpoint);
    restore.restore().get(120, TimeUnit.SECONDS);
    restore.close();
  }

  static void copyTree(Path from, Path to) throws IOException {
    try (Stream<Path> s = Files.walk(from)) {
      for (Path p : s.collect(Collectors.toList())) {
        Path target = to.resolve(from.relativize(p).toString());
        if (Files.isDirectory(p)) {
          Files.createDirectories(target);
        } else {
          Files.copy(p, target, StandardCopyOption.COPY_ATTRIBUTES);
        }
      }
    }
  }
}
