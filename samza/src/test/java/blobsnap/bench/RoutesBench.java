package blobsnap.bench;

import blobsnap.BenchAccess;
import blobsnap.samza.S3BlobStoreManagerFactory;
import java.io.File;
import java.io.IOException;
import java.net.URI;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Random;
import java.util.UUID;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.stream.Stream;
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
import org.apache.samza.storage.TaskBackupManager;
import org.apache.samza.storage.TaskRestoreManager;
import org.apache.samza.storage.blobstore.BlobStoreStateBackendFactory;
import org.apache.samza.util.SystemClock;
import org.rocksdb.Checkpoint;
import org.rocksdb.CompressionType;
import org.rocksdb.FlushOptions;
import org.rocksdb.Options;
import org.rocksdb.RocksDB;
import org.rocksdb.WriteOptions;
import software.amazon.awssdk.auth.credentials.AwsBasicCredentials;
import software.amazon.awssdk.auth.credentials.StaticCredentialsProvider;
import software.amazon.awssdk.core.sync.ResponseTransformer;
import software.amazon.awssdk.regions.Region;
import software.amazon.awssdk.services.s3.S3Client;
import software.amazon.awssdk.services.s3.model.CreateBucketRequest;
import software.amazon.awssdk.services.s3.model.GetObjectRequest;
import software.amazon.awssdk.services.s3.model.ListObjectsV2Request;
import software.amazon.awssdk.services.s3.model.S3Object;

/**
 * Route 1 (blobsnap's engine through JNI) against route 2 (Samza 1.8.0's own blob-store engine
 * through S3BlobStoreManager) on one RocksJava store and one S3 server (issue 50's targets;
 * benches/samza-routes.sh runs it, numbers in RESULTS.md §8). The same checkpoints go through
 * both routes, each into a bucket of its own:
 *
 * <ol>
 *   <li>the first backup of the whole store;
 *   <li>{@code --commits} commits under steady writes ({@code --write-mib} of overwrites, a flush
 *       and a RocksJava checkpoint each): time per commit and bytes added to the bucket;
 *   <li>a commit of an unchanged store (Samza makes a new checkpoint dir each time): time and
 *       objects added;
 *   <li>a restore on a new host (empty store dir), and a restart whose latest local checkpoint
 *       dir is gone (the store dir still holds the state of two commits before);
 *   <li>the server's GET line: every blob of the last snapshot by raw parallel GETs.
 * </ol>
 *
 * <pre>java -cp … -Dblobsnap.native.lib=…/release/libblobsnap_samza_jni.so blobsnap.bench.RoutesBench
 *   WORK_DIR [--mib 1024] [--commits 10] [--write-mib 16] [--transfers 16]</pre>
 */
public final class RoutesBench {
  static final String STORE = "counts";
  static final String TASK = "Partition 0";
  static final int VALUE = 4096;

  private RoutesBench() {}

  interface Route {
    String name();

    TaskBackupManager backup(File base) throws Exception;

    TaskRestoreManager restore(File base) throws Exception;

    CheckpointV2 checkpoint(CheckpointId id, Map<String, String> markers);
  }

  public static void main(String[] args) throws Exception {
    Path work = Paths.get(args[0]).toAbsolutePath();
    Map<String, String> opt = new HashMap<>();
    for (int i = 1; i + 1 < args.length; i += 2) {
      opt.put(args[i], args[i + 1]);
    }
    int mib = Integer.parseInt(opt.getOrDefault("--mib", "1024"));
    int commits = Integer.parseInt(opt.getOrDefault("--commits", "10"));
    int writeMib = Integer.parseInt(opt.getOrDefault("--write-mib", "16"));
    String transfers = opt.getOrDefault("--transfers", "16");
    String endpoint = System.getenv("BLOBSNAP_TEST_S3_ENDPOINT");
    if (endpoint == null || !"127.0.0.1".equals(URI.create(endpoint).getHost())) {
      throw new IllegalStateException("BLOBSNAP_TEST_S3_ENDPOINT must name an S3 server on 127.0.0.1");
    }
    String region = env("BLOBSNAP_TEST_S3_REGION", "us-east-1");
    deleteTree(work);
    Files.createDirectories(work);
    S3Client raw = S3Client.builder().endpointOverride(URI.create(endpoint)).forcePathStyle(true)
        .region(Region.of(region))
        .credentialsProvider(StaticCredentialsProvider.create(AwsBasicCredentials.create(
            env("BLOBSNAP_TEST_S3_ACCESS_KEY", "test"), env("BLOBSNAP_TEST_S3_SECRET_KEY", "test"))))
        .build();
    String tag = UUID.randomUUID().toString().substring(0, 8);
    String samzaBucket = ("bench-samza-" + tag).toLowerCase(Locale.ROOT);
    String jniBucket = ("bench-jni-" + tag).toLowerCase(Locale.ROOT);
    raw.createBucket(CreateBucketRequest.builder().bucket(samzaBucket).build());
    raw.createBucket(CreateBucketRequest.builder().bucket(jniBucket).build());

    ExecutorService pool = Executors.newFixedThreadPool(Integer.parseInt(transfers), named("bench-"));
    TaskName taskName = new TaskName(TASK);
    TaskModel taskModel = new TaskModel(taskName, Collections.emptySet(), new Partition(0));
    ContainerModel container = new ContainerModel("0", Collections.singletonMap(taskName, taskModel));
    StorageManagerUtil util = new StorageManagerUtil();

    Route samza = samzaRoute(samzaBucket, endpoint, region, transfers, taskModel, container, pool);
    Route jni = jniRoute(jniBucket, endpoint, region, transfers, taskModel, pool);
    List<Route> routes = Arrays.asList(samza, jni);

    // ---- the store ----
    File base = work.resolve("host1").toFile();
    File storeDir = util.getTaskStoreDir(base, STORE, taskName, taskModel.getTaskMode());
    Files.createDirectories(storeDir.toPath());
    RocksDB.loadLibrary();
    CheckpointId twoBack = null;
    Map<Route, Map<String, String>> last = new HashMap<>();
    Map<Route, CheckpointId> lastId = new HashMap<>();
    Random rnd = new Random(1);
    long keys = (long) mib * 1024 * 1024 / VALUE;
    long t0 = System.nanoTime();
    try (Options o = new Options().setCreateIfMissing(true).setWriteBufferSize(16L << 20)
        .setTargetFileSizeBase(4L << 20).setMaxBytesForLevelBase(64L << 20)
        .setCompressionType(CompressionType.NO_COMPRESSION);
        RocksDB db = RocksDB.open(o, storeDir.getPath());
        WriteOptions wo = new WriteOptions().setDisableWAL(true);
        FlushOptions fo = new FlushOptions().setWaitForFlush(true)) {
      byte[] v = new byte[VALUE];
      for (long k = 0; k < keys; k++) {
        rnd.nextBytes(v);
        db.put(wo, key(k), v);
      }
      db.flush(fo);
      db.compactRange();
      System.out.printf("store: %d MiB of %d-byte values (%d keys), %d files, made in %.1f s%n", mib, VALUE, keys,
          count(storeDir.toPath()), (System.nanoTime() - t0) / 1e9);

      Map<Route, TaskBackupManager> backups = new HashMap<>();
      for (Route r : routes) {
        TaskBackupManager b = r.backup(base);
        b.init(null);
        backups.put(r, b);
      }

      // ---- 1. the first backup ----
      CheckpointId cid = checkpoint(db, storeDir, util);
      for (Route r : routes) {
        long bytes0 = bucketBytes(raw, r == samza ? samzaBucket : jniBucket);
        long t = System.nanoTime();
        Map<String, String> m = commit(backups.get(r), cid);
        double s = (System.nanoTime() - t) / 1e9;
        long added = bucketBytes(raw, r == samza ? samzaBucket : jniBucket) - bytes0;
        // Committed (Samza would write its checkpoint here): the next commit's base.
        backups.get(r).cleanUp(cid, m).get(600, TimeUnit.SECONDS);
        System.out.println(String.format("%-6s first backup: %.2f s, %.1f MiB up (%.0f MiB/s)", r.name(), s, added / 1048576.0,
            added / 1048576.0 / s));
        last.put(r, m);
        lastId.put(r, cid);
      }

      // ---- 2. steady writes, a commit each round ----
      Map<Route, List<Double>> times = new HashMap<>();
      Map<Route, List<Long>> added = new HashMap<>();
      for (int i = 0; i < commits; i++) {
        for (long n = 0; n < (long) writeMib * 1024 * 1024 / VALUE; n++) {
          rnd.nextBytes(v);
          db.put(wo, key((long) (rnd.nextDouble() * keys)), v);
        }
        db.flush(fo);
        cid = checkpoint(db, storeDir, util);
        if (i == commits - 3) {
          twoBack = cid;
        }
        for (Route r : routes) {
          String bucket = r == samza ? samzaBucket : jniBucket;
          java.util.Set<String> before = new java.util.HashSet<>();
          list(raw, bucket).forEach(obj -> before.add(obj.key()));
          long t = System.nanoTime();
          Map<String, String> m = commit(backups.get(r), cid);
          times.computeIfAbsent(r, x -> new ArrayList<>()).add((System.nanoTime() - t) / 1e6);
          // The bytes of the objects this commit added (a cleanup's deletes do not count).
          added.computeIfAbsent(r, x -> new ArrayList<>()).add(list(raw, bucket).stream()
              .filter(obj -> !before.contains(obj.key())).mapToLong(S3Object::size).sum());
          backups.get(r).cleanUp(cid, m).get(600, TimeUnit.SECONDS);
          last.put(r, m);
          lastId.put(r, cid);
        }
      }
      for (Route r : routes) {
        List<Double> ts = new ArrayList<>(times.get(r));
        Collections.sort(ts);
        long sum = added.get(r).stream().mapToLong(Long::longValue).sum();
        System.out.println(String.format("%-6s %d commits under %d MiB of overwrites each: p50 %.0f ms, p99 (max) %.0f ms;"
                + " %.2f MiB uploaded per commit (new objects)", r.name(), commits, writeMib, ts.get(ts.size() / 2),
            ts.get(ts.size() - 1), sum / 1048576.0 / commits));
      }

      // ---- 3. an unchanged store ----
      // RocksDB's compactions after the last flush change the files: wait until none runs or
      // is pending, commit what they made, then commit the store unchanged.
      long waitUntil = System.nanoTime() + TimeUnit.SECONDS.toNanos(120);
      while (!"0".equals(db.getProperty("rocksdb.num-running-compactions"))
          || !"0".equals(db.getProperty("rocksdb.compaction-pending"))) {
        if (System.nanoTime() > waitUntil) {
          throw new IllegalStateException("RocksDB's compactions did not settle within 120 s");
        }
        Thread.sleep(50);
      }
      cid = checkpoint(db, storeDir, util);
      for (Route r : routes) {
        Map<String, String> m = commit(backups.get(r), cid);
        backups.get(r).cleanUp(cid, m).get(600, TimeUnit.SECONDS);
        last.put(r, m);
        lastId.put(r, cid);
      }
      cid = checkpoint(db, storeDir, util);
      for (Route r : routes) {
        String bucket = r == samza ? samzaBucket : jniBucket;
        int objects0 = objects(raw, bucket);
        long t = System.nanoTime();
        Map<String, String> m = commit(backups.get(r), cid);
        double ms = (System.nanoTime() - t) / 1e6;
        int objects1 = objects(raw, bucket);
        System.out.println(String.format("%-6s unchanged store (%d files): commit %.1f ms, %d objects added%s", r.name(),
            count(util.getStoreCheckpointDir(storeDir, cid)), ms, objects1 - objects0,
            m.equals(last.get(r)) ? " (the marker carried forward)" : ""));
        last.put(r, m);
        lastId.put(r, cid);
      }
      for (Route r : routes) {
        backups.get(r).close();
      }
    }

    // ---- 4. restores ----
    for (Route r : routes) {
      File host2 = work.resolve(r.name() + "-new-host").toFile();
      long t = System.nanoTime();
      restore(r, host2, last, lastId);
      double s = (System.nanoTime() - t) / 1e9;
      long bytes = dirBytes(util.getTaskStoreDir(host2, STORE, taskName, taskModel.getTaskMode()).toPath());
      System.out.printf("%-6s restore on a new host: %.2f s (%.1f MiB, %.0f MiB/s)%n", r.name(), s,
          bytes / 1048576.0, bytes / 1048576.0 / s);
    }
    // A restart whose latest local checkpoint dir is gone: the store dir holds the state of two
    // commits before the last (a copy of that checkpoint dir), no checkpoint dir is left.
    for (Route r : routes) {
      File host3 = work.resolve(r.name() + "-restart").toFile();
      Path dir = util.getTaskStoreDir(host3, STORE, taskName, taskModel.getTaskMode()).toPath();
      copyTree(Paths.get(util.getStoreCheckpointDir(storeDir, twoBack)), dir);
      long t = System.nanoTime();
      restore(r, host3, last, lastId);
      double s = (System.nanoTime() - t) / 1e9;
      System.out.printf("%-6s restart, the latest local checkpoint dir gone (the store two commits behind): %.2f s%n",
          r.name(), s);
    }
    // ---- 5. the server's GET line ----
    for (String bucket : Arrays.asList(samzaBucket, jniBucket)) {
      System.out.printf("GET line (%s, every object, %s parallel raw GETs): %.0f MiB/s%n", bucket, transfers,
          getLine(raw, bucket, "", Integer.parseInt(transfers)));
    }
    pool.shutdownNow();
    raw.close();
  }

  static void copyTree(Path from, Path to) throws IOException {
    try (Stream<Path> s = Files.walk(from)) {
      for (Path p : (Iterable<Path>) s::iterator) {
        Path target = to.resolve(from.relativize(p).toString());
        if (Files.isDirectory(p)) {
          Files.createDirectories(target);
        } else {
          Files.copy(p, target);
        }
      }
    }
  }

  static Map<String, String> commit(TaskBackupManager b, CheckpointId cid) throws Exception {
    Map<String, String> snap = b.snapshot(cid);
    return b.upload(cid, snap).get(600, TimeUnit.SECONDS);
  }

  static void restore(Route r, File base, Map<Route, Map<String, String>> last, Map<Route, CheckpointId> lastId)
      throws Exception {
    Files.createDirectories(base.toPath());
    TaskRestoreManager m = r.restore(base);
    m.init(r.checkpoint(lastId.get(r), last.get(r)));
    m.restore().get(1200, TimeUnit.SECONDS);
    m.close();
  }

  static CheckpointId checkpoint(RocksDB db, File storeDir, StorageManagerUtil util) throws Exception {
    CheckpointId cid = CheckpointId.create();
    try (Checkpoint cp = Checkpoint.create(db)) {
      cp.createCheckpoint(util.getStoreCheckpointDir(storeDir, cid));
    }
    return cid;
  }

  static byte[] key(long k) {
    return String.format("key-%012d", k).getBytes(java.nio.charset.StandardCharsets.UTF_8);
  }

  static Route samzaRoute(String bucket, String endpoint, String region, String transfers, TaskModel taskModel,
      ContainerModel container, ExecutorService pool) {
    Map<String, String> c = new HashMap<>();
    c.put("job.name", "bench");
    c.put("job.id", "1");
    c.put("stores." + STORE + ".factory", "org.apache.samza.storage.kv.RocksDbKeyValueStorageEngineFactory");
    c.put("stores." + STORE + ".backup.factories", BlobStoreStateBackendFactory.class.getName());
    c.put("stores." + STORE + ".restore.factories", BlobStoreStateBackendFactory.class.getName());
    c.put("blob.store.manager.factory", S3BlobStoreManagerFactory.class.getName());
    c.put("blobsnap.s3.bucket", bucket);
    c.put("blobsnap.s3.endpoint", endpoint);
    c.put("blobsnap.s3.region", region);
    c.put("blobsnap.s3.path-style", "true");
    c.put("blobsnap.store.max-transfers", transfers);
    MapConfig config = new MapConfig(c);
    JobContext jobContext = JobContextImpl.fromConfigWithDefaults(config,
        new JobModel(config, Collections.singletonMap("0", container)));
    BlobStoreStateBackendFactory f = new BlobStoreStateBackendFactory();
    return new Route() {
      @Override
      public String name() {
        return "samza";
      }

      @Override
      public TaskBackupManager backup(File base) {
        return f.getBackupManager(jobContext, container, taskModel, Collections.emptyMap(), pool,
            new MetricsRegistryMap(), config, SystemClock.instance(), base, base);
      }

      @Override
      public TaskRestoreManager restore(File base) {
        return f.getRestoreManager(jobContext, null, taskModel, pool, new MetricsRegistryMap(),
            Collections.singleton(STORE), config, SystemClock.instance(), base, base, null);
      }

      @Override
      public CheckpointV2 checkpoint(CheckpointId id, Map<String, String> markers) {
        return new CheckpointV2(id, Collections.emptyMap(),
            Collections.singletonMap(BlobStoreStateBackendFactory.class.getName(), markers));
      }
    };
  }

  static Route jniRoute(String bucket, String endpoint, String region, String transfers, TaskModel taskModel,
      ExecutorService pool) {
    Map<String, String> c = new HashMap<>();
    c.put("job.name", "bench");
    c.put("job.id", "1");
    c.put("blobsnap.store.kind", "s3");
    c.put("blobsnap.s3.bucket", bucket);
    c.put("blobsnap.s3.endpoint", endpoint);
    c.put("blobsnap.s3.region", region);
    c.put("blobsnap.s3.path-style", "true");
    c.put("blobsnap.store.max-transfers", transfers);
    MapConfig config = new MapConfig(c);
    return new Route() {
      @Override
      public String name() {
        return "jni";
      }

      @Override
      public TaskBackupManager backup(File base) {
        return BenchAccess.backup(config, taskModel, base, pool);
      }

      @Override
      public TaskRestoreManager restore(File base) {
        return BenchAccess.restore(config, taskModel, base, pool);
      }

      @Override
      public CheckpointV2 checkpoint(CheckpointId id, Map<String, String> markers) {
        return new CheckpointV2(id, Collections.emptyMap(),
            Collections.singletonMap(blobsnap.BlobStoreStateBackendFactory.class.getName(), markers));
      }
    };
  }

  static String env(String name, String dflt) {
    String v = System.getenv(name);
    return v == null || v.isEmpty() ? dflt : v;
  }

  static java.util.concurrent.ThreadFactory named(String prefix) {
    AtomicInteger n = new AtomicInteger();
    return r -> {
      Thread t = new Thread(r, prefix + n.incrementAndGet());
      t.setDaemon(true);
      return t;
    };
  }

  static long bucketBytes(S3Client raw, String bucket) {
    return list(raw, bucket).stream().mapToLong(S3Object::size).sum();
  }

  static int objects(S3Client raw, String bucket) {
    return list(raw, bucket).size();
  }

  static List<S3Object> list(S3Client raw, String bucket) {
    List<S3Object> out = new ArrayList<>();
    raw.listObjectsV2Paginator(ListObjectsV2Request.builder().bucket(bucket).build()).contents().forEach(out::add);
    return out;
  }

  static long count(Path dir) throws IOException {
    try (Stream<Path> s = Files.list(dir)) {
      return s.count();
    }
  }

  static long count(String dir) throws IOException {
    return count(Paths.get(dir));
  }

  static long dirBytes(Path dir) throws IOException {
    try (Stream<Path> s = Files.walk(dir)) {
      return s.filter(Files::isRegularFile).mapToLong(p -> p.toFile().length()).sum();
    }
  }

  static void deleteTree(Path dir) throws IOException {
    if (Files.exists(dir)) {
      try (Stream<Path> s = Files.walk(dir)) {
        for (Path p : (Iterable<Path>) s.sorted(Collections.reverseOrder())::iterator) {
          Files.delete(p);
        }
      }
    }
  }

  /** The GET line: every object under {@code prefix} by {@code threads} raw parallel GETs; MiB/s. */
  static double getLine(S3Client raw, String bucket, String prefix, int threads) throws Exception {
    List<S3Object> objs = new ArrayList<>();
    raw.listObjectsV2Paginator(ListObjectsV2Request.builder().bucket(bucket).prefix(prefix).build()).contents()
        .forEach(objs::add);
    ExecutorService p = Executors.newFixedThreadPool(threads, named("get-"));
    long t = System.nanoTime();
    List<Future<Long>> fs = new ArrayList<>();
    for (S3Object o : objs) {
      fs.add(p.submit(() -> raw.getObject(GetObjectRequest.builder().bucket(bucket).key(o.key()).build(),
          ResponseTransformer.toBytes()).asByteArray().length + 0L));
    }
    long bytes = 0;
    for (Future<Long> f : fs) {
      bytes += f.get();
    }
    p.shutdown();
    return bytes / 1048576.0 / ((System.nanoTime() - t) / 1e9);
  }
}
