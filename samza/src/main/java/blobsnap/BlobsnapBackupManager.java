package blobsnap;

import java.io.File;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executor;
import org.apache.samza.checkpoint.Checkpoint;
import org.apache.samza.checkpoint.CheckpointId;
import org.apache.samza.checkpoint.CheckpointV2;
import org.apache.samza.serializers.CheckpointV2Serde;
import org.apache.samza.storage.StorageManagerUtil;
import org.apache.samza.storage.TaskBackupManager;

/**
 * One task's backup through blobsnap's engine: {@code upload} sends the checkpoint dir Samza
 * made of each store ({@code <storeDir>-<checkpointId>}, RocksJava's hard links) as
 * content-addressed blobs, only what the last snapshot lacks, and an index in Samza's shape whose
 * key is the store's marker; {@code cleanUp} deletes what left the retention. Futures complete on
 * Samza's backup executor.
 */
final class BlobsnapBackupManager implements TaskBackupManager {
  private final long handle;
  private final Map<String, File> storeDirs;
  private final Executor executor;
  private final StorageManagerUtil util = new StorageManagerUtil();

  /** {@code prepared}: the job's checkpoints are another manager's (prepared history records). */
  BlobsnapBackupManager(Engine engine, String task, Map<String, File> storeDirs, Executor executor, boolean prepared) {
    this.storeDirs = storeDirs;
    this.executor = executor;
    this.handle = Native.backupNew(engine.handle, engine.job, engine.jobId, task,
        BlobStoreStateBackendFactory.flatDirs(storeDirs), prepared);
  }

  static byte[] json(Checkpoint checkpoint) {
    if (checkpoint == null) {
      return null;
    }
    if (!(checkpoint instanceof CheckpointV2)) {
      throw new BlobsnapException("invalid-input", "blobsnap reads CheckpointV2 only, got version "
          + checkpoint.getVersion() + ": set task.checkpoint.read.versions=2,1");
    }
    return new CheckpointV2Serde().toBytes((CheckpointV2) checkpoint);
  }

  @Override
  public void init(Checkpoint checkpoint) {
    Native.backupInit(handle, json(checkpoint));
  }

  @Override
  public Map<String, String> snapshot(CheckpointId checkpointId) {
    return Engine.map(Native.backupSnapshot(handle, checkpointId.serialize()));
  }

  @Override
  public CompletableFuture<Map<String, String>> upload(CheckpointId checkpointId, Map<String, String> markers) {
    List<String> dirs = new ArrayList<>();
    for (Map.Entry<String, File> e : storeDirs.entrySet()) {
      dirs.add(e.getKey());
      dirs.add(util.getStoreCheckpointDir(e.getValue(), checkpointId));
    }
    CompletableFuture<String[]> raw = new CompletableFuture<>();
    Native.backupUpload(handle, checkpointId.serialize(), Engine.flat(markers), dirs.toArray(new String[0]), raw);
    return cancellable(Engine.handOff(raw, executor).thenApply(Engine::map));
  }

  @Override
  public CompletableFuture<Void> cleanUp(CheckpointId checkpointId, Map<String, String> markers) {
    CompletableFuture<Void> raw = new CompletableFuture<>();
    Native.backupCleanup(handle, checkpointId.serialize(), Engine.flat(markers == null
        ? java.util.Collections.<String, String>emptyMap() : markers), raw);
    return cancellable(Engine.handOff(raw, executor));
  }

  /** A cancel of the caller's future reaches the native work (its cancel token). */
  private <T> CompletableFuture<T> cancellable(CompletableFuture<T> f) {
    f.whenComplete((v, e) -> {
      if (f.isCancelled()) {
        Native.cancel(handle);
      }
    });
    return f;
  }

  /** Cancels and awaits the work in flight, deletes the task's writer lease; idempotent. */
  @Override
  public void close() {
    Native.close(handle);
  }
}
