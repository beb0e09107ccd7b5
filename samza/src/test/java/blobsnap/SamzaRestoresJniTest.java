package blobsnap;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import blobsnap.samza.S3BlobStoreManagerFactory;
import java.io.File;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Collections;
import java.util.HashMap;
import java.util.Locale;
import java.util.Map;
import java.util.TreeMap;
import java.util.UUID;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import org.apache.samza.Partition;
import org.apache.samza.checkpoint.CheckpointId;
import org.apache.samza.checkpoint.CheckpointV2;
import org.apache.samza.config.MapConfig;
import org.apache.samza.container.TaskName;
import org.apache.samza.context.JobContext;
import org.apache.samza.context.JobContextImpl;
import org.apache.samza.job.model.ContainerModel;
import org.apache.samza.job.model.JobModel;
import org.apache.samza.job.model.TaskModel;
import org.apache.samza.metrics.MetricsRegistryMap;
import org.apache.samza.storage.StorageManagerUtil;
import org.apache.samza.storage.TaskRestoreManager;
import org.apache.samza.util.SystemClock;
import org.junit.jupiter.api.Test;
import org.rocksdb.Checkpoint;
import org.rocksdb.FlushOptions;
import org.rocksdb.Options;
import org.rocksdb.RocksDB;
import org.rocksdb.RocksIterator;

/**
 * The other direction of the two routes: a RocksJava (7.0.3, Samza's) store's checkpoint, backed
 * up by route 1 (blobsnap's engine through JNI, in this JVM beside rocksdbjni) in Samza's index
 * shape, is restored by Samza 1.8.0's OWN {@code BlobStoreRestoreManager} (through route 2's
 * S3BlobStoreManager, on the suite's S3 server), passes its post-restore check of every file
 * against the index, and opens in RocksJava with the same keys and values.
 */
class SamzaRestoresJniTest {
  static final String SAMZA_FACTORY = "org.apache.samza.storage.blobstore.BlobStoreStateBackendFactory";
  static final String STORE = "counts";
  static final String TASK = "Partition 0";

  static String env(String name, String dflt) {
    String v = System.getenv(name);
    return v == null || v.isEmpty() ? dflt : v;
  }

  @Test
  void samzasRestoreManagerRestoresWhatTheJniRouteWrote() throws Exception {
    String ep = env("BLOBSNAP_TEST_S3_ENDPOINT", null);
    if (ep == null || !"127.0.0.1".equals(URI.create(ep).getHost())) {
      fail("BLOBSNAP_TEST_S3_ENDPOINT must name the suite's S3 server on 127.0.0.1 (scripts/test.sh), got " + ep);
    }
    Path root = Paths.get(System.getProperty("blobsnap.spike.work"), "samza-restores-jni").toAbsolutePath();
    NativeTest.delete(root);
    String bucket = ("blobsnap-both-" + UUID.randomUUID().toString().substring(0, 8)).toLowerCase(Locale.ROOT);
    Map<String, String> c = new HashMap<>();
    c.put("job.name", "both.ways");
    c.put("job.id", "1");
    c.put("stores." + STORE + ".factory", "org.apache.samza.storage.kv.RocksDbKeyValueStorageEngineFactory");
    c.put("stores." + STORE + ".backup.factories", SAMZA_FACTORY);
    c.put("stores." + STORE + ".restore.factories", SAMZA_FACTORY);
    c.put("blob.store.manager.factory", S3BlobStoreManagerFactory.class.getName());
    // One set of keys for both routes: the settings file's, prefixed blobsnap.
    c.put("blobsnap.store.kind", "s3");
    c.put("blobsnap.s3.bucket", bucket);
    c.put("blobsnap.s3.endpoint", ep);
    c.put("blobsnap.s3.region", env("BLOBSNAP_TEST_S3_REGION", "us-east-1"));
    c.put("blobsnap.s3.path-style", "true");
    MapConfig config = new MapConfig(c);
    ExecutorService pool = Executors.newFixedThreadPool(2);
    try {
      // ---- a RocksJava store and its checkpoint, as Samza makes them ----
      TaskName taskName = new TaskName(TASK);
      TaskModel taskModel = new TaskModel(taskName, Collections.emptySet(), new Partition(0));
      StorageManagerUtil util = new StorageManagerUtil();
      File storeDir = util.getTaskStoreDir(root.resolve("host1").toFile(), STORE, taskName, taskModel.getTaskMode());
      Files.createDirectories(storeDir.toPath());
      CheckpointId cid = CheckpointId.create();
      Map<String, String> expected = new TreeMap<>();
      RocksDB.loadLibrary();
      try (Options o = new Options().setCreateIfMissing(true); RocksDB db = RocksDB.open(o, storeDir.getPath())) {
        for (int i = 0; i < 5000; i++) {
          String k = "key-" + i;
          String v = "value-" + (i * 7919L);
          db.put(k.getBytes(StandardCharsets.UTF_8), v.getBytes(StandardCharsets.UTF_8));
          expected.put(k, v);
          if (i == 2500) {
            try (FlushOptions f = new FlushOptions().setWaitForFlush(true)) {
              db.flush(f);
            }
          }
        }
        try (FlushOptions f = new FlushOptions().setWaitForFlush(true)) {
          db.flush(f);
        }
        try (Checkpoint cp = Checkpoint.create(db)) {
          cp.createCheckpoint(util.getStoreCheckpointDir(storeDir, cid));
        }
      }

      // ---- route 1 backs it up (JNI), in Samza's index shape ----
      Engine engine = Engine.open(config);
      Native.adminResources(engine.handle, engine.job, engine.jobId, true);
      BlobsnapBackupManager backup =
          new BlobsnapBackupManager(engine, TASK, Collections.singletonMap(STORE, storeDir), pool, false);
      backup.init(null);
      Map<String, String> markers = backup.upload(cid, backup.snapshot(cid)).get(120, TimeUnit.SECONDS);
      backup.close();
      String marker = markers.get(STORE);
      assertTrue(marker != null && marker.startsWith("index/" + cid.serialize() + "."), markers.toString());

      // ---- Samza's own restore manager restores it on a new host ----
      CheckpointV2 checkpoint = new CheckpointV2(cid, Collections.emptyMap(),
          Collections.singletonMap(SAMZA_FACTORY, Collections.singletonMap(STORE, marker)));
      ContainerModel container = new ContainerModel("0", Collections.singletonMap(taskName, taskModel));
      JobContext jobContext = JobContextImpl.fromConfigWithDefaults(config,
          new JobModel(config, Collections.singletonMap("0", container)));
      Path base = root.resolve("host2");
      Path nonLogged = root.resolve("host2-non-logged");
      Files.createDirectories(base);
      Files.createDirectories(nonLogged);
      TaskRestoreManager restore = new org.apache.samza.storage.blobstore.BlobStoreStateBackendFactory()
          .getRestoreManager(jobContext, null, taskModel, pool, new MetricsRegistryMap(), Collections.singleton(STORE),
              config, SystemClock.instance(), base.toFile(), nonLogged.toFile(), null);
      restore.init(checkpoint);
      restore.restore().get(120, TimeUnit.SECONDS); // Samza checks every file against the index here
      restore.close();
      File restored = util.getTaskStoreDir(base.toFile(), STORE, taskName, taskModel.getTaskMode());
      for (String f : new File(util.getStoreCheckpointDir(storeDir, cid)).list()) {
        assertArrayEquals(Files.readAllBytes(new File(util.getStoreCheckpointDir(storeDir, cid), f).toPath()),
            Files.readAllBytes(restored.toPath().resolve(f)), f + " restored byte for byte by Samza");
      }
      Map<String, String> got = new TreeMap<>();
      try (Options o = new Options(); RocksDB db = RocksDB.openReadOnly(o, restored.getPath());
          RocksIterator it = db.newIterator()) {
        for (it.seekToFirst(); it.isValid(); it.next()) {
          got.put(new String(it.key(), StandardCharsets.UTF_8), new String(it.value(), StandardCharsets.UTF_8));
        }
      }
      assertEquals(expected, got, "RocksJava reads the same keys and values from Samza's restore of route 1's snapshot");
      System.out.println("both ways: route 1 backed up " + expected.size() + " keys (" + marker
          + "), Samza 1.8.0's BlobStoreRestoreManager restored and verified them");
    } finally {
      pool.shutdownNow();
    }
  }
}
