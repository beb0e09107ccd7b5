// blobsnap's lazy file system: a RocksDB FileSystemWrapper over the default file system that
// asks blobsnap (Rust, through the callbacks below) before RocksDB opens, sizes, links,
// renames or deletes a file. A file blobsnap holds as *remote* (an SST or blob file of a lazy
// restore that is still only in the blob store) is fetched, verified whole and renamed into
// place before RocksDB opens it; its existence and size are answered from the restore's
// index; a hard link of it (a RocksDB checkpoint) is recorded, not made; a deletion drops it.
// Every other file goes straight to the default file system.
//
// Registered in RocksDB's object registry under the name "blobsnap-lazy" by an explicit call
// from Rust (blobsnap_lazyfs_install), so that the options string "env=blobsnap-lazy" selects
// a process-lifetime Env over this file system. Nothing here holds a lock across a callback.

#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "rocksdb/env.h"
#include "rocksdb/file_system.h"
#include "rocksdb/utilities/object_registry.h"

extern "C" {
// The callbacks into blobsnap. Paths are passed as (pointer, length), not NUL-terminated.
struct blobsnap_lazyfs_callbacks {
  // 1 and *size set: `path` is remote. 0: not a remote file (ask the file system).
  int32_t (*remote_size)(const char* path, size_t len, uint64_t* size);
  // Make `path` local if it is remote (blocking, verified). 0: go on. -1: failed, a message
  // of at most msg_cap - 1 bytes and a NUL written into msg.
  int32_t (*fetch)(const char* path, size_t len, char* msg, size_t msg_cap);
  // 1: `src` is remote and `dst` was recorded as naming the same remote file. 0: link it.
  int32_t (*link)(const char* src, size_t src_len, const char* dst, size_t dst_len);
  // 1: `path` was remote and is now dropped (nothing to delete on disk). 0: delete it.
  int32_t (*drop)(const char* path, size_t len);
  // `src` was renamed to `dst` (a file or a directory): remote entries under it follow.
  void (*renamed)(const char* src, size_t src_len, const char* dst, size_t dst_len);
};
}
// Five function pointers, as src/local/lazy/ffi.rs declares (and asserts) them.
static_assert(sizeof(blobsnap_lazyfs_callbacks) == 5 * sizeof(void*),
              "blobsnap_lazyfs_callbacks must match src/local/lazy/ffi.rs");

namespace {

using ROCKSDB_NAMESPACE::Env;
using ROCKSDB_NAMESPACE::FileOptions;
using ROCKSDB_NAMESPACE::FileSystem;
using ROCKSDB_NAMESPACE::FileSystemWrapper;
using ROCKSDB_NAMESPACE::FSRandomAccessFile;
using ROCKSDB_NAMESPACE::FSSequentialFile;
using ROCKSDB_NAMESPACE::IODebugContext;
using ROCKSDB_NAMESPACE::IOOptions;
using ROCKSDB_NAMESPACE::IOStatus;

blobsnap_lazyfs_callbacks g_callbacks;  // set once, before the factory can be reached

class LazyFs : public FileSystemWrapper {
 public:
  explicit LazyFs(const std::shared_ptr<FileSystem>& base) : FileSystemWrapper(base) {}

  static const char* kClassName() { return "BlobsnapLazyFs"; }
  const char* Name() const override { return kClassName(); }

  IOStatus NewSequentialFile(const std::string& f, const FileOptions& o,
                             std::unique_ptr<FSSequentialFile>* r,
                             IODebugContext* dbg) override {
    IOStatus s = Fetch(f);
    if (!s.ok()) return s;
    return FileSystemWrapper::NewSequentialFile(f, o, r, dbg);
  }

  IOStatus NewRandomAccessFile(const std::string& f, const FileOptions& o,
                               std::unique_ptr<FSRandomAccessFile>* r,
                               IODebugContext* dbg) override {
    IOStatus s = Fetch(f);
    if (!s.ok()) return s;
    return FileSystemWrapper::NewRandomAccessFile(f, o, r, dbg);
  }

  IOStatus FileExists(const std::string& f, const IOOptions& o,
                      IODebugContext* dbg) override {
    uint64_t size = 0;
    if (g_callbacks.remote_size(f.data(), f.size(), &size) == 1) return IOStatus::OK();
    return FileSystemWrapper::FileExists(f, o, dbg);
  }

  IOStatus GetFileSize(const std::string& f, const IOOptions& o, uint64_t* size,
                       IODebugContext* dbg) override {
    if (g_callbacks.remote_size(f.data(), f.size(), size) == 1) return IOStatus::OK();
    return FileSystemWrapper::GetFileSize(f, o, size, dbg);
  }

  IOStatus LinkFile(const std::string& src, const std::string& dst, const IOOptions& o,
                    IODebugContext* dbg) override {
    if (g_callbacks.link(src.data(), src.size(), dst.data(), dst.size()) == 1) {
      return IOStatus::OK();
    }
    return FileSystemWrapper::LinkFile(src, dst, o, dbg);
  }

  IOStatus DeleteFile(const std::string& f, const IOOptions& o,
                      IODebugContext* dbg) override {
    if (g_callbacks.drop(f.data(), f.size()) == 1) return IOStatus::OK();
    return FileSystemWrapper::DeleteFile(f, o, dbg);
  }

  IOStatus RenameFile(const std::string& src, const std::string& dst, const IOOptions& o,
                      IODebugContext* dbg) override {
    IOStatus s = FileSystemWrapper::RenameFile(src, dst, o, dbg);
    if (s.ok()) g_callbacks.renamed(src.data(), src.size(), dst.data(), dst.size());
    return s;
  }

 private:
  // 0: local now. -1: failed for good (plain IOError: a corrupt or missing blob, a closed
  // store). -2: failed for now (a retryable IOError: RocksDB reschedules a compaction that
  // needed the file instead of stopping the DB's writes).
  static IOStatus Fetch(const std::string& f) {
    char msg[512];
    msg[0] = '\0';
    int32_t rc = g_callbacks.fetch(f.data(), f.size(), msg, sizeof msg);
    if (rc != 0) {
      msg[sizeof msg - 1] = '\0';
      IOStatus s = IOStatus::IOError("blobsnap lazy restore: " + f, msg);
      if (rc == -2) s.SetRetryable(true);
      return s;
    }
    return IOStatus::OK();
  }
};

// The one Env over LazyFs, alive for the whole process (RocksDB's registry hands out a raw
// pointer to a static object and never frees it).
Env* LazyEnv() {
  static Env* env =
      ROCKSDB_NAMESPACE::NewCompositeEnv(std::make_shared<LazyFs>(FileSystem::Default()))
          .release();
  return env;
}

}  // namespace

extern "C" {

// Install the callbacks and register the Env "blobsnap-lazy" (the first call wins; later
// calls do nothing). Returns 0; 1 when `size` is not this side's struct size; 2 when C++
// threw (nothing unwinds into the Rust caller, which imports this as plain "C").
int32_t blobsnap_lazyfs_install(const blobsnap_lazyfs_callbacks* callbacks, size_t size) {
  if (size != sizeof(blobsnap_lazyfs_callbacks)) return 1;
  try {
    static std::once_flag once;
    std::call_once(once, [callbacks] {
      g_callbacks = *callbacks;
      ROCKSDB_NAMESPACE::ObjectLibrary::Default()->AddFactory<Env>(
          "blobsnap-lazy",
          [](const std::string& /*uri*/, std::unique_ptr<Env>* /*guard*/,
             std::string* /*errmsg*/) { return LazyEnv(); });
    });
  } catch (...) {
    return 2;
  }
  return 0;
}

// Make sure the default Env's LOW and HIGH pools (which every DB of the process, the lazy
// ones included, schedule on) have at least `low` and `high` threads: never shrinks them.
// Catches everything (nothing unwinds into Rust).
void blobsnap_lazyfs_widen_pools(int32_t low, int32_t high) {
  try {
    Env* env = Env::Default();
    env->IncBackgroundThreadsIfNeeded(low, Env::Priority::LOW);
    env->IncBackgroundThreadsIfNeeded(high, Env::Priority::HIGH);
  } catch (...) {
  }
}

}  // extern "C"
