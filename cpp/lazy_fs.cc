// blobsnap's lazy file system: a RocksDB FileSystemWrapper over the default file system that
// asks blobsnap (Rust, through the callbacks below) before RocksDB opens, sizes, links,
// renames or deletes a file. A file blobsnap holds as *remote* (an SST or blob file of a lazy
// restore that is still only in the blob store) is fetched, verified whole and renamed into
// place before RocksDB opens it; its existence and size are answered from the restore's
// index; a hard link of it (a RocksDB checkpoint) is recorded, not made; a deletion drops it.
// A remote blob file (`*.blob`) opened without direct reads is fetched at its first read
// instead: a read of its footer alone (what RocksDB's purge asks of an obsolete blob file
// before deleting it) is answered by a ranged read of the blob, so a blob file the live DB
// compacted away is never downloaded whole. Every other file goes straight to the default
// file system.
//
// Registered in RocksDB's object registry under the name "blobsnap-lazy" by an explicit call
// from Rust (blobsnap_lazyfs_install), so that the options string "env=blobsnap-lazy" selects
// a process-lifetime Env over this file system. Nothing here holds a lock across a callback.

#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/listener.h"
#include "rocksdb/options.h"
#include "rocksdb/sst_file_manager.h"
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
  // 1: `path` is remote and its `n` bytes at `offset` (its last ones, n at most 64) were
  // read from its blob into `buf`. 0: not served (fetch the file and read it locally).
  int32_t (*read_tail)(const char* path, size_t len, uint64_t offset, size_t n, char* buf);
};
}
// Six function pointers, as src/local/lazy/ffi.rs declares (and asserts) them.
static_assert(sizeof(blobsnap_lazyfs_callbacks) == 6 * sizeof(void*),
              "blobsnap_lazyfs_callbacks must match src/local/lazy/ffi.rs");

namespace {

using ROCKSDB_NAMESPACE::Env;
using ROCKSDB_NAMESPACE::FileOptions;
using ROCKSDB_NAMESPACE::FileSystem;
using ROCKSDB_NAMESPACE::FileSystemWrapper;
using ROCKSDB_NAMESPACE::FSRandomAccessFile;
using ROCKSDB_NAMESPACE::FSReadRequest;
using ROCKSDB_NAMESPACE::FSSequentialFile;
using ROCKSDB_NAMESPACE::IODebugContext;
using ROCKSDB_NAMESPACE::IOOptions;
using ROCKSDB_NAMESPACE::IOStatus;
using ROCKSDB_NAMESPACE::Slice;

blobsnap_lazyfs_callbacks g_callbacks;  // set once, before the factory can be reached

// Make `f` local if it is remote (defined below).
IOStatus Fetch(const std::string& f);

// A remote blob file opened for reading, not yet fetched. A read of at most its last
// kMaxTail bytes while nothing else was read is served from the blob (a ranged read,
// through `read_tail`): RocksDB's purge reads only the footer (32 bytes) of an obsolete blob
// file before it deletes it. Any other read (and a tail read the blob store cannot serve)
// fetches the file, verified whole, opens it on the base file system and reads it there;
// every later call goes to that file. The open is guarded by `mu_`, which is never held
// across a callback (the fetch runs before it is taken; concurrent fetches of one file wait
// for the same download in blobsnap).
class DeferredFile : public FSRandomAccessFile {
 public:
  static constexpr size_t kMaxTail = 64;

  // `base` is the lazy file system's target, the default file system: it outlives every file.
  DeferredFile(FileSystem* base, std::string path, FileOptions options, uint64_t size)
      : base_(base), path_(std::move(path)), options_(std::move(options)), size_(size) {}

  IOStatus Read(uint64_t offset, size_t n, const IOOptions& o, Slice* result, char* scratch,
                IODebugContext* dbg) const override {
    if (Opened() == nullptr && n > 0 && n <= kMaxTail && offset + n == size_ &&
        g_callbacks.read_tail(path_.data(), path_.size(), offset, n, scratch) == 1) {
      *result = Slice(scratch, n);
      return IOStatus::OK();
    }
    FSRandomAccessFile* file = nullptr;
    IOStatus s = Open(&file);
    if (!s.ok()) return s;
    return file->Read(offset, n, o, result, scratch, dbg);
  }

  IOStatus MultiRead(FSReadRequest* reqs, size_t num_reqs, const IOOptions& o,
                     IODebugContext* dbg) override {
    FSRandomAccessFile* file = nullptr;
    IOStatus s = Open(&file);
    if (!s.ok()) return s;
    return file->MultiRead(reqs, num_reqs, o, dbg);
  }

  IOStatus Prefetch(uint64_t offset, size_t n, const IOOptions& o,
                    IODebugContext* dbg) override {
    FSRandomAccessFile* file = nullptr;
    IOStatus s = Open(&file);
    if (!s.ok()) return s;
    return file->Prefetch(offset, n, o, dbg);
  }

  IOStatus InvalidateCache(size_t offset, size_t length) override {
    FSRandomAccessFile* file = Opened();
    return file == nullptr ? IOStatus::OK() : file->InvalidateCache(offset, length);
  }

  IOStatus GetFileSize(uint64_t* result) override {
    *result = size_;
    return IOStatus::OK();
  }

 private:
  FSRandomAccessFile* Opened() const {
    std::lock_guard<std::mutex> lock(mu_);
    return file_.get();
  }

  IOStatus Open(FSRandomAccessFile** out) const {
    if (FSRandomAccessFile* f = Opened()) {
      *out = f;
      return IOStatus::OK();
    }
    IOStatus s = Fetch(path_);  // no lock held: blocks until the file is in place
    if (!s.ok()) return s;
    std::lock_guard<std::mutex> lock(mu_);
    if (!file_) {
      std::unique_ptr<FSRandomAccessFile> f;
      s = base_->NewRandomAccessFile(path_, options_, &f, nullptr);
      if (!s.ok()) return s;
      file_ = std::move(f);
    }
    *out = file_.get();
    return IOStatus::OK();
  }

  FileSystem* base_;
  std::string path_;
  FileOptions options_;
  uint64_t size_;
  mutable std::mutex mu_;
  mutable std::unique_ptr<FSRandomAccessFile> file_;
};

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
    uint64_t size = 0;
    if (!o.use_direct_reads && IsBlobFile(f) &&
        g_callbacks.remote_size(f.data(), f.size(), &size) == 1) {
      r->reset(new DeferredFile(target(), f, o, size));
      return IOStatus::OK();
    }
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
  static bool IsBlobFile(const std::string& f) {
    static const std::string kSuffix = ".blob";
    return f.size() > kSuffix.size() &&
           f.compare(f.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0;
  }
};

// 0: local now. -1: failed for good (plain IOError: a corrupt or missing blob, a closed
// store). -2: failed for now (a retryable IOError: RocksDB reschedules a compaction that
// needed the file instead of stopping the DB's writes).
IOStatus Fetch(const std::string& f) {
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

// The one Env over LazyFs, alive for the whole process (RocksDB's registry hands out a raw
// pointer to a static object and never frees it).
Env* LazyEnv() {
  static Env* env =
      ROCKSDB_NAMESPACE::NewCompositeEnv(std::make_shared<LazyFs>(FileSystem::Default()))
          .release();
  return env;
}

}  // namespace

// Pre-upload (src/blob/preupload.rs): an EventListener that tells blobsnap, through one
// callback, when RocksDB has finished writing a table or blob file (created and synced, before
// it joins a version) and when it deleted one. `kind`: 1 table created, 2 blob file created,
// 3 table deleted, 4 blob file deleted. Only successful creations and deletions are reported.
// The callback is blobsnap's and never blocks (it queues the event).
typedef void (*blobsnap_file_event_fn)(uint64_t token, int32_t kind, const char* path,
                                       size_t len);

class FileEvents : public ROCKSDB_NAMESPACE::EventListener {
 public:
  FileEvents(blobsnap_file_event_fn fn, uint64_t token) : fn_(fn), token_(token) {}

  const char* Name() const override { return "blobsnap-file-events"; }

  void OnTableFileCreated(const ROCKSDB_NAMESPACE::TableFileCreationInfo& i) override {
    if (i.status.ok()) Tell(1, i.file_path);
  }
  void OnBlobFileCreated(const ROCKSDB_NAMESPACE::BlobFileCreationInfo& i) override {
    if (i.status.ok()) Tell(2, i.file_path);
  }
  void OnTableFileDeleted(const ROCKSDB_NAMESPACE::TableFileDeletionInfo& i) override {
    if (i.status.ok()) Tell(3, i.file_path);
  }
  void OnBlobFileDeleted(const ROCKSDB_NAMESPACE::BlobFileDeletionInfo& i) override {
    if (i.status.ok()) Tell(4, i.file_path);
  }

 private:
  void Tell(int32_t kind, const std::string& path) {
    fn_(token_, kind, path.data(), path.size());
  }
  blobsnap_file_event_fn fn_;
  uint64_t token_;
};

// The layout of the C API's options handle (`struct rocksdb_options_t { Options rep; }`,
// db/c.cc): its one member is the Options. rust-rocksdb hands the handle out (`AsRawPtr`);
// blobsnap_add_file_listener adds the listener through this mirror of it.
struct blobsnap_c_options {
  ROCKSDB_NAMESPACE::Options rep;
};

// The layout of the C API's DB handle (`struct rocksdb_t { DB* rep; }`, db/c.cc): its one
// member is the DB. rust-rocksdb hands the handle out (`AsRawPtr`);
// blobsnap_lazyfs_tracked_bytes and blobsnap_file_reads read the DB through this mirror of it.
struct blobsnap_c_db {
  ROCKSDB_NAMESPACE::DB* rep;
};

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

// The bytes the DB's SstFileManager accounts for (0 without one, or when C++ threw).
uint64_t blobsnap_lazyfs_tracked_bytes(void* handle) {
  try {
    auto* db = static_cast<blobsnap_c_db*>(handle);
    if (db == nullptr || db->rep == nullptr) return 0;
    std::shared_ptr<ROCKSDB_NAMESPACE::SstFileManager> sfm =
        db->rep->GetDBOptions().sst_file_manager;
    return sfm ? sfm->GetTotalSize() : 0;
  } catch (...) {
    return 0;
  }
}

// The sampled read counts of the live table files of the DB behind `handle` (a rocksdb_t):
// RocksDB counts one in 1,024 reads of a file (Get, MultiGet, iterator seeks and nexts) and
// adds 1,024, so `num_reads_sampled` estimates the reads since the DB was opened. Writes
// "name count\n" lines (the file's name relative to the DB dir) into `buf` while they fit in
// `cap` bytes and returns the length of the whole text: the caller asks again with a buffer
// of that size if it was larger than `cap`. Returns 0 for a null handle or when C++ threw.
size_t blobsnap_file_reads(void* handle, char* buf, size_t cap) {
  try {
    auto* db = static_cast<blobsnap_c_db*>(handle);
    if (db == nullptr || db->rep == nullptr) return 0;
    std::vector<ROCKSDB_NAMESPACE::LiveFileMetaData> files;
    db->rep->GetLiveFilesMetaData(&files);
    std::string text;
    for (const auto& f : files) {
      text += f.relative_filename;
      text += ' ';
      text += std::to_string(f.num_reads_sampled);
      text += '\n';
    }
    if (buf != nullptr && text.size() <= cap) std::memcpy(buf, text.data(), text.size());
    return text.size();
  } catch (...) {
    return 0;
  }
}

// Add a FileEvents listener reporting to `fn` with `token` to the options behind `handle`
// (a rocksdb_options_t). Returns 0; 1 for a null argument; 2 when C++ threw.
int32_t blobsnap_add_file_listener(void* handle, blobsnap_file_event_fn fn, uint64_t token) {
  if (handle == nullptr || fn == nullptr) return 1;
  try {
    auto* options = static_cast<blobsnap_c_options*>(handle);
    options->rep.listeners.push_back(std::make_shared<FileEvents>(fn, token));
  } catch (...) {
    return 2;
  }
  return 0;
}

}  // extern "C"
