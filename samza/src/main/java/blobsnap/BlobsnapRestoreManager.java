package blobsnap;

import java.io.File;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executor;
import org.apache.samza.checkpoint.Checkpoint;
import org.apache.samza.storage.TaskRestoreManager;

/**
 * One task's restore through blobsnap's engine: each store's index (its marker in the
 * checkpoint), compared with the files already in the store dir, and only what is missing
 * downloaded, every byte verified by its SHA-256, the tree then swapped in whole.
 */
final class BlobsnapRestoreManager implements TaskRestoreManager {
  private final long handle;
  private final Executor executor;

  BlobsnapRestoreManager(Engine engine, String task, Map<String, File> storeDirs, Executor executor) {
    this.executor = executor;
    this.handle = Native.restoreNew(engine.handle, engine.job, engine.jobId, task,
        BlobStoreStateBackendFactory.flatDirs(storeDirs));
  }

  @Override
  public void init(Checkpoint checkpoint) {
    Native.restoreInit(handle, BlobsnapBackupManager.json(checkpoint));
  }

  @Override
  public CompletableFuture<Void> restore() {
    CompletableFuture<Void> raw = new CompletableFuture<>();
    Native.restoreRun(handle, raw);
    CompletableFuture<Void> out = Engine.handOff(raw, executor);
    out.whenComplete((v, e) -> {
      if (out.isCancelled()) {
        Native.cancel(handle);
      }
    });
    return out;
  }

  @Override
  public void close() {
    Native.close(handle);
  }
}
