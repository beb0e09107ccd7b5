package blobsnap;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.io.File;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.TreeMap;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import java.util.stream.Stream;
import org.apache.samza.checkpoint.CheckpointId;
import org.apache.samza.checkpoint.CheckpointV2;
import org.apache.samza.config.MapConfig;
import org.apache.samza.storage.StorageManagerUtil;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The JNI library (samza/native) through the Samza classes, on a local-directory store (no
 * server): a backup and restore round trip whose futures complete on the caller's executor,
 * never on a runtime worker; hostile input (a typo in the config, a missing dir, a bad marker, a
 * corrupt blob, a closed handle) as a {@link BlobsnapException} with blobsnap's kind and message,
 * never a JVM crash; close() racing uploads in flight.
 */
class NativeTest {
  static final String TASK = "Partition 0";
  static ExecutorService executor;
  static Path root;

  @BeforeAll
  static void setUp() throws IOException {
    String lib = System.getProperty("blobsnap.native.lib");
    if (lib == null || lib.isEmpty() || lib.startsWith("${") || !new File(lib).isFile()) {
      fail("system property blobsnap.native.lib must name the built library (cargo build -p blobsnap-samza-jni;"
          + " scripts/samza.sh passes it), got " + lib);
    }
    executor = Executors.newFixedThreadPool(2, r -> {
      Thread t = new Thread(r, "samza-executor");
      t.setDaemon(true);
      return t;
    });
    root = Paths.get(System.getProperty("blobsnap.spike.work"), "native-test").toAbsolutePath();
    delete(root);
    Files.createDirectories(root);
  }

  @AfterAll
  static void tearDown() {
    if (executor != null) {
      executor.shutdown();
    }
  }

  static MapConfig config(Path store, String... extra) {
    Map<String, String> c = new HashMap<>();
    c.put("job.name", "native");
    c.put("job.id", "1");
    c.put("blobsnap.store.kind", "local");
    c.put("blobsnap.store.local-dir", store.toString());
    for (int i = 0; i + 1 < extra.length; i += 2) {
      c.put(extra[i], extra[i + 1]);
    }
    return new MapConfig(c);
  }

  /** A store dir and Samza's checkpoint dir of it for {@code id}, with a few files. */
  static Map<String, byte[]> checkpointDir(File storeDir, CheckpointId id) throws IOException {
    Path cp = Paths.get(new StorageManagerUtil().getStoreCheckpointDir(storeDir, id));
    Files.createDirectories(cp);
    Files.createDirectories(storeDir.toPath());
    Map<String, byte[]> files = new TreeMap<>();
    Random r = new Random(id.getMillis());
    byte[] sst = new byte[300_000];
    r.nextBytes(sst);
    files.put("000007.sst", sst);
    files.put("CURRENT", "MANIFEST-000005\n".getBytes(StandardCharsets.UTF_8));
    files.put("MANIFEST-000005", ("manifest " + id).getBytes(StandardCharsets.UTF_8));
    for (Map.Entry<String, byte[]> e : files.entrySet()) {
      Files.write(cp.resolve(e.getKey()), e.getValue());
    }
    return files;
  }

  static CheckpointV2 checkpoint(CheckpointId id, Map<String, String> markers) {
    return new CheckpointV2(id, Collections.emptyMap(),
        Collections.singletonMap(BlobStoreStateBackendFactory.class.getName(), markers));
  }

  @Test
  void backupAndRestoreRoundTripOnTheCallersExecutor() throws Exception {
    Path store = root.resolve("round-trip-store");
    MapConfig config = config(store);
    Engine engine = Engine.open(config);
    File storeDir = root.resolve("host1/counts/Partition_0").toFile();
    Map<String, File> dirs = Collections.singletonMap("counts", storeDir);
    BlobsnapBackupManager backup = new BlobsnapBackupManager(engine, TASK, dirs, executor, false);
    CheckpointId id = CheckpointId.create();
    Map<String, byte[]> files = checkpointDir(storeDir, id);
    backup.init(null);
    Map<String, String> snap = backup.snapshot(id);
    AtomicReference<String> stageThread = new AtomicReference<>();
    Map<String, String> markers = backup.upload(id, snap)
        .whenComplete((v, e) -> stageThread.set(Thread.currentThread().getName()))
        .get(60, TimeUnit.SECONDS);
    assertEquals("samza-executor", stageThread.get(),
        "the caller's stages run on Samza's executor, never on a runtime worker of the library");
    assertEquals(Collections.singleton("counts"), markers.keySet());
    assertTrue(markers.get("counts").matches("index/[0-9]+-[0-9]+\\.[0-9a-f]{64}\\.json"), markers.toString());
    backup.cleanUp(id, markers).get(60, TimeUnit.SECONDS);
    backup.close();
    backup.close(); // idempotent

    // A new host restores it byte for byte.
    File restored = root.resolve("host2/counts/Partition_0").toFile();
    BlobsnapRestoreManager restore =
        new BlobsnapRestoreManager(engine, TASK, Collections.singletonMap("counts", restored), executor);
    restore.init(checkpoint(id, markers));
    restore.restore().get(60, TimeUnit.SECONDS);
    restore.close();
    for (Map.Entry<String, byte[]> e : files.entrySet()) {
      assertArrayEquals(e.getValue(), Files.readAllBytes(restored.toPath().resolve(e.getKey())), e.getKey());
    }

    // A corrupt blob: the restore fails, classified, naming what is wrong.
    Path blob;
    try (Stream<Path> s = Files.walk(store)) {
      blob = s.filter(p -> Files.isRegularFile(p) && p.toString().contains("/blobs/"))
          .filter(p -> {
            try {
              return Files.size(p) == 300_000;
            } catch (IOException e) {
              return false;
            }
          }).findFirst().orElseThrow(() -> new AssertionError("the SST's blob in " + store));
    }
    byte[] bytes = Files.readAllBytes(blob);
    bytes[12345] ^= 1;
    Files.write(blob, bytes);
    File host3 = root.resolve("host3/counts/Partition_0").toFile();
    BlobsnapRestoreManager again =
        new BlobsnapRestoreManager(engine, TASK, Collections.singletonMap("counts", host3), executor);
    again.init(checkpoint(id, markers));
    BlobsnapException e = failure(again.restore());
    assertEquals("corrupt", e.kind(), e.getMessage());
    again.close();
  }

  @Test
  void hostileInputIsAJavaExceptionWithBlobsnapsKindAndMessage() throws Exception {
    Path store = root.resolve("hostile-store");
    // A typo in the config: named.
    BlobsnapException typo = assertThrows(BlobsnapException.class,
        () -> Engine.open(config(store, "blobsnap.s3.bukket", "b")));
    assertEquals("invalid-input", typo.kind());
    assertTrue(typo.getMessage().contains("bukket"), typo.getMessage());
    // Lazy restore under Samza: refused at start.
    BlobsnapException lazy = assertThrows(BlobsnapException.class,
        () -> Engine.open(config(store, "blobsnap.job.restore-mode", "lazy")));
    assertTrue(lazy.getMessage().contains("RocksJava"), lazy.getMessage());

    Engine engine = Engine.open(config(store));
    File storeDir = root.resolve("hostile/counts/Partition_0").toFile();
    BlobsnapBackupManager backup =
        new BlobsnapBackupManager(engine, TASK, Collections.singletonMap("counts", storeDir), executor, false);
    backup.init(null);
    // Samza's checkpoint dir is missing: the upload fails naming it.
    CheckpointId id = CheckpointId.create();
    BlobsnapException missing = failure(backup.upload(id, Collections.emptyMap()));
    String cpDir = new StorageManagerUtil().getStoreCheckpointDir(storeDir, id);
    assertTrue(missing.getMessage().contains(cpDir), missing.getMessage());
    // A relative store dir: refused.
    BlobsnapException relative = assertThrows(BlobsnapException.class, () -> new BlobsnapBackupManager(engine, TASK,
        Collections.singletonMap("counts", new File("relative/dir")), executor, false));
    assertEquals("invalid-input", relative.kind());

    // A bad marker: a key outside the layout, and garbage.
    for (String marker : new String[] {"../../../../etc/passwd", "not a marker", ""}) {
      BlobsnapRestoreManager restore = new BlobsnapRestoreManager(engine, TASK,
          Collections.singletonMap("counts", root.resolve("hostile-restore/counts/Partition_0").toFile()), executor);
      BlobsnapException bad;
      try {
        restore.init(checkpoint(CheckpointId.create(), Collections.singletonMap("counts", marker)));
        bad = failure(restore.restore());
      } catch (BlobsnapException sync) {
        bad = sync;
      }
      assertTrue(bad.kind().equals("invalid-input") || bad.kind().equals("corrupt") || bad.kind().equals("not-found"),
          marker + ": " + bad.kind() + " " + bad.getMessage());
      assertTrue(bad.getMessage().contains("marker") || bad.getMessage().contains(marker),
          marker + ": " + bad.getMessage());
      restore.close();
    }

    // A closed handle: every call throws, none crashes.
    backup.close();
    BlobsnapException closed = assertThrows(BlobsnapException.class, () -> backup.snapshot(CheckpointId.create()));
    assertTrue(closed.getMessage().contains("closed"), closed.getMessage());
    assertThrows(BlobsnapException.class, () -> backup.upload(CheckpointId.create(), Collections.emptyMap()));
    assertThrows(BlobsnapException.class, () -> backup.init(null));
    backup.close();
    // A null where a value belongs.
    BlobsnapException nul = assertThrows(BlobsnapException.class, () -> Native.backupSnapshot(engine.handle, null));
    assertEquals("invalid-input", nul.kind());
  }

  @Test
  void closeRacingUploadsInFlightCompletesEveryFuture() throws Exception {
    Path store = root.resolve("race-store");
    Engine engine = Engine.open(config(store));
    File storeDir = root.resolve("race/counts/Partition_0").toFile();
    BlobsnapBackupManager backup =
        new BlobsnapBackupManager(engine, TASK, Collections.singletonMap("counts", storeDir), executor, false);
    backup.init(null);
    List<CompletableFuture<Map<String, String>>> inFlight = new ArrayList<>();
    for (int i = 0; i < 16; i++) {
      CheckpointId id = CheckpointId.create();
      checkpointDir(storeDir, id);
      inFlight.add(backup.upload(id, Collections.emptyMap()));
    }
    backup.close(); // cancels what is in flight and waits for it
    int ok = 0;
    int cancelled = 0;
    for (CompletableFuture<Map<String, String>> f : inFlight) {
      try {
        f.get(60, TimeUnit.SECONDS);
        ok++;
      } catch (ExecutionException e) {
        BlobsnapException b = assertInstanceOf(BlobsnapException.class, e.getCause());
        assertEquals("cancelled", b.kind(), b.getMessage());
        cancelled++;
      }
    }
    assertEquals(16, ok + cancelled);
    System.out.println("close racing 16 uploads: " + ok + " completed, " + cancelled + " cancelled");
  }

  static BlobsnapException failure(CompletableFuture<?> f) throws Exception {
    try {
      f.get(60, TimeUnit.SECONDS);
    } catch (ExecutionException e) {
      return assertInstanceOf(BlobsnapException.class, e.getCause(), String.valueOf(e.getCause()));
    }
    throw new AssertionError("the future completed normally");
  }

  static void delete(Path dir) throws IOException {
    if (Files.exists(dir)) {
      try (Stream<Path> s = Files.walk(dir)) {
        for (Path p : (Iterable<Path>) s.sorted(Collections.reverseOrder())::iterator) {
          Files.delete(p);
        }
      }
    }
  }
}
