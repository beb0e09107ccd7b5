//! The one place blobsnap uses `unsafe`: the bridge between RocksDB's file system wrapper
//! (`cpp/lazy_fs.cc`, compiled by `build.rs` against the bundled RocksDB's headers) and the
//! lazy restore's registry (the parent module, safe Rust).
//!
//! Why `unsafe` here and nowhere else: rust-rocksdb exposes no way to give RocksDB a custom
//! file system. RocksDB itself selects an Env by name from an options string (`env=…`,
//! through its object registry), which rust-rocksdb does expose
//! (`Options::get_options_from_string`); registering our Env under a name takes one call
//! into C++, and the Env's answers come back through six `extern "C"` callbacks. Both
//! directions cross the FFI boundary, which Rust cannot check. One more call widens the
//! default Env's thread pools (`IncBackgroundThreadsIfNeeded`, which the C API lacks).
//!
//! Safety argument:
//! - `blobsnap_lazyfs_install` is called with a pointer to a `static` callbacks struct
//!   (valid for the whole process), once (`std::sync::Once`; the C++ side also keeps only
//!   its first call). Its layout is `#[repr(C)]`, field for field the C struct's.
//! - Each callback receives `(pointer, length)` of a `std::string` that RocksDB owns for the
//!   duration of the call; the bytes are only borrowed inside the call (never stored: the
//!   registry copies what it keeps into `PathBuf`s). A null pointer is answered "not mine".
//! - The out-parameters (`size`, the message buffer of `msg_cap` bytes) point at the C++
//!   caller's stack; they are written only when non-null, the message at most `msg_cap - 1`
//!   bytes plus a NUL. `read_tail`'s `buf` is RocksDB's scratch buffer of at least `n` bytes
//!   (`FSRandomAccessFile::Read`'s contract); `n` is checked against a small cap before it is
//!   used, and exactly `n` bytes are written, only when the answer is 1.
//! - No panic crosses into C++: every callback runs under `catch_unwind`; a panic answers
//!   "not mine" (the file system goes on) or, for a fetch, an I/O error. No C++ exception
//!   crosses into Rust: `blobsnap_lazyfs_install` catches everything and returns nonzero.
//! - The struct's layout is pinned on both sides: a compile-time size assertion here and a
//!   `static_assert` in C++, and the size Rust passes at install is checked against C++'s.
//! - [`set_db_options`] calls the C API's `rocksdb_set_db_options` (rust-rocksdb wraps only
//!   the column-family `SetOptions`): the DB handle is borrowed from a live `rocksdb::DB` for
//!   the duration of the call; the key and value arrays point at `CString`s that outlive the
//!   call (RocksDB copies what it keeps); an error string RocksDB allocates is copied and
//!   released with `rocksdb_free`.
//! - [`add_file_listener`] passes the options handle rust-rocksdb owns (borrowed mutably for
//!   the call, so nothing else uses it meanwhile) to C++, which reads the Options out of it by
//!   the C API's own definition of the handle (`struct rocksdb_options_t { Options rep; }`,
//!   db/c.cc, repeated in cpp/lazy_fs.cc) and appends a listener to its `listeners`; the
//!   listener holds `on_file_event` (a plain `extern "C"` function, valid for the process's
//!   life) and a token (an integer, not a pointer). RocksDB calls it on its background threads
//!   with a path it owns for the call; `on_file_event` copies what it keeps, never blocks and
//!   never unwinds (`catch_unwind`).
//! - [`tracked_bytes`] and [`file_reads`] pass the same borrowed handle to C++, which reads the DB out of it by
//!   the C API's own definition of the handle (`struct rocksdb_t { DB* rep; }`, db/c.cc of
//!   the bundled RocksDB, repeated in cpp/lazy_fs.cc), and catches every exception;
//!   `file_reads` hands C++ a buffer of `cap` bytes it owns, and C++ writes into it only when
//!   the whole text fits.

#![allow(unsafe_code)]

use std::ffi::{c_char, OsStr};
use std::os::unix::ffi::OsStrExt as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

#[repr(C)]
struct Callbacks {
    remote_size: extern "C" fn(*const c_char, usize, *mut u64) -> i32,
    fetch: extern "C" fn(*const c_char, usize, *mut c_char, usize) -> i32,
    link: extern "C" fn(*const c_char, usize, *const c_char, usize) -> i32,
    drop: extern "C" fn(*const c_char, usize) -> i32,
    renamed: extern "C" fn(*const c_char, usize, *const c_char, usize),
    read_tail: extern "C" fn(*const c_char, usize, u64, usize, *mut c_char) -> i32,
}

// The C side is built with exceptions; `blobsnap_lazyfs_install` catches every one and
// returns nonzero, so nothing unwinds across this import.
extern "C" {
    fn blobsnap_lazyfs_install(callbacks: *const Callbacks, size: usize) -> i32;
    fn blobsnap_lazyfs_widen_pools(low: i32, high: i32);
    fn blobsnap_lazyfs_tracked_bytes(db: *mut std::ffi::c_void) -> u64;
    fn blobsnap_file_reads(db: *mut std::ffi::c_void, buf: *mut c_char, cap: usize) -> usize;
    fn blobsnap_add_file_listener(
        options: *mut std::ffi::c_void,
        callback: extern "C" fn(u64, i32, *const c_char, usize),
        token: u64,
    ) -> i32;
}

/// Make the DB opened with `opts` report its finished and deleted table and blob files to
/// [`crate::local::events`] under `token`. False if RocksDB refused (nothing is reported then).
pub(crate) fn add_file_listener(opts: &mut rocksdb::Options, token: u64) -> bool {
    use rocksdb::AsRawPtr as _;
    // SAFETY: see the module docs: the handle is live and ours for the call; the callback is
    // a static function; C++ catches every exception.
    unsafe { blobsnap_add_file_listener(opts.as_raw_ptr().cast(), on_file_event, token) == 0 }
}

extern "C" fn on_file_event(token: u64, kind: i32, ptr: *const c_char, len: usize) {
    guarded((), || {
        if let Some(p) = path(ptr, len) {
            crate::local::events::publish(token, kind, p);
        }
    });
}

/// The bytes `db`'s SstFileManager accounts for (its tracked SST and blob files).
pub(crate) fn tracked_bytes(db: &rocksdb::DB) -> u64 {
    use rocksdb::AsRawPtr as _;
    // SAFETY: see the module docs: `db` is live for the call; C++ catches every exception.
    unsafe { blobsnap_lazyfs_tracked_bytes(db.as_raw_ptr().cast()) }
}

/// The sampled read count of each live table file of `db` since it was opened (RocksDB's
/// `num_reads_sampled`), by name relative to the DB dir. Empty if RocksDB reports nothing.
pub(crate) fn file_reads(db: &rocksdb::DB) -> Vec<(String, u64)> {
    use rocksdb::AsRawPtr as _;
    let mut buf: Vec<u8> = vec![0; 4096];
    // Files come and go between two calls: ask again while the text outgrows the buffer.
    for _ in 0..8 {
        // SAFETY: see the module docs: `db` is live for the call; C++ writes at most `cap`
        // bytes into `buf`, which has them, and catches every exception.
        let len = unsafe {
            blobsnap_file_reads(db.as_raw_ptr().cast(), buf.as_mut_ptr().cast(), buf.len())
        };
        if len > buf.len() {
            buf.resize(len + 1024, 0);
            continue;
        }
        return String::from_utf8_lossy(&buf[..len])
            .lines()
            .filter_map(|l| {
                let (name, n) = l.rsplit_once(' ')?;
                Some((name.to_string(), n.parse().ok()?))
            })
            .collect();
    }
    Vec::new()
}

/// `SetDBOptions(options)` on the open `db` (for example `max_open_files`, which resizes the
/// table cache of the open DB and is persisted in a new OPTIONS file).
pub(crate) fn set_db_options(db: &rocksdb::DB, options: &[(&str, &str)]) -> Result<(), String> {
    use rocksdb::AsRawPtr as _;
    use std::ffi::{CStr, CString};
    let cstr = |s: &str| CString::new(s).map_err(|_| format!("option {s:?} contains NUL"));
    let keys = options
        .iter()
        .map(|(k, _)| cstr(k))
        .collect::<Result<Vec<_>, _>>()?;
    let values = options
        .iter()
        .map(|(_, v)| cstr(v))
        .collect::<Result<Vec<_>, _>>()?;
    let kp: Vec<*const c_char> = keys.iter().map(|k| k.as_ptr()).collect();
    let vp: Vec<*const c_char> = values.iter().map(|v| v.as_ptr()).collect();
    let count = i32::try_from(options.len()).map_err(|_| "too many options".to_string())?;
    let mut err: *mut c_char = std::ptr::null_mut();
    // SAFETY: see the module docs: `db` is live for the call, the arrays and their strings
    // outlive it, `err` is written by RocksDB only on error.
    unsafe {
        librocksdb_sys::rocksdb_set_db_options(
            db.as_raw_ptr(),
            count,
            kp.as_ptr(),
            vp.as_ptr(),
            &mut err,
        );
    }
    if err.is_null() {
        return Ok(());
    }
    // SAFETY: a NUL-terminated string RocksDB allocated for us; copied, then freed once.
    let msg = unsafe {
        let m = CStr::from_ptr(err).to_string_lossy().into_owned();
        librocksdb_sys::rocksdb_free(err.cast());
        m
    };
    Err(msg)
}

/// At least `low` LOW and `high` HIGH threads in the default Env's pools (never fewer than
/// before).
pub(super) fn widen_pools(low: i32, high: i32) {
    // SAFETY: plain integers by value; the C++ side catches every exception.
    unsafe { blobsnap_lazyfs_widen_pools(low, high) }
}

// The struct is declared twice (here and in cpp/lazy_fs.cc): both sides pin its layout, six
// function pointers (C++ static_asserts the same size, and checks the size passed at install).
const _: () = assert!(std::mem::size_of::<Callbacks>() == 6 * std::mem::size_of::<usize>());

static CALLBACKS: Callbacks = Callbacks {
    remote_size: on_remote_size,
    fetch: on_fetch,
    link: on_link,
    drop: on_drop,
    renamed: on_renamed,
    read_tail: on_read_tail,
};

/// Register the `blobsnap-lazy` Env with RocksDB (once per process).
pub(super) fn install() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: CALLBACKS is a static of the C struct's layout; see the module docs.
        let rc = unsafe { blobsnap_lazyfs_install(&CALLBACKS, std::mem::size_of::<Callbacks>()) };
        if rc != 0 {
            tracing::error!(
                rc,
                "the lazy file system could not be registered with RocksDB"
            );
        }
    });
}

/// The path RocksDB passed, borrowed for the call.
fn path<'a>(ptr: *const c_char, len: usize) -> Option<&'a Path> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `ptr` and `len` are a live std::string's data() and size() for the whole call,
    // and the returned borrow does not outlive the callback that made it.
    let bytes = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
    Some(Path::new(OsStr::from_bytes(bytes)))
}

fn guarded<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(on_panic)
}

extern "C" fn on_remote_size(ptr: *const c_char, len: usize, size: *mut u64) -> i32 {
    guarded(0, || {
        let Some(s) = path(ptr, len).and_then(super::fs::remote_size) else {
            return 0;
        };
        if !size.is_null() {
            // SAFETY: a non-null out-parameter on the caller's stack.
            unsafe { *size = s };
        }
        1
    })
}

/// The fetch callback's answers (`cpp/lazy_fs.cc` maps them to an `IOStatus`).
const FETCH_OK: i32 = 0;
/// Failed for good (a corrupt or missing blob, a closed store): a plain I/O error.
const FETCH_FAILED: i32 = -1;
/// Failed for now (the store's endpoint did not answer): a retryable I/O error, so a
/// compaction that needed the file is rescheduled instead of stopping the DB's writes.
const FETCH_RETRYABLE: i32 = -2;

extern "C" fn on_fetch(ptr: *const c_char, len: usize, msg: *mut c_char, msg_cap: usize) -> i32 {
    let r = guarded(
        Err((crate::ErrorKind::Io, "panic while fetching".to_string())),
        || path(ptr, len).map_or(Ok(()), super::fs::fetch_now),
    );
    match r {
        Ok(()) => FETCH_OK,
        Err((kind, text)) => {
            // The kind first, so that a message cut at msg_cap keeps it: the reader of the
            // RocksDB error classifies by it (`local::rocks::classify`).
            let text = format!("[{kind}] {text}");
            if !msg.is_null() && msg_cap > 0 {
                // Cut at a character boundary at most msg_cap - 1 bytes in.
                let mut n = text.len().min(msg_cap - 1);
                while !text.is_char_boundary(n) {
                    n -= 1;
                }
                // SAFETY: `msg` is the caller's buffer of `msg_cap` bytes; n + 1 ≤ msg_cap.
                unsafe {
                    std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), msg, n);
                    *msg.add(n) = 0;
                }
            }
            if kind == crate::ErrorKind::Transient {
                FETCH_RETRYABLE
            } else {
                FETCH_FAILED
            }
        }
    }
}

extern "C" fn on_link(
    src: *const c_char,
    src_len: usize,
    dst: *const c_char,
    dst_len: usize,
) -> i32 {
    guarded(0, || match (path(src, src_len), path(dst, dst_len)) {
        (Some(s), Some(d)) => i32::from(super::links::link(s, d)),
        _ => 0,
    })
}

extern "C" fn on_drop(ptr: *const c_char, len: usize) -> i32 {
    guarded(0, || {
        path(ptr, len).map_or(0, |p| i32::from(super::fs::drop_file(p)))
    })
}

extern "C" fn on_renamed(src: *const c_char, src_len: usize, dst: *const c_char, dst_len: usize) {
    guarded((), || {
        if let (Some(s), Some(d)) = (path(src, src_len), path(dst, dst_len)) {
            super::fs::renamed(s, d);
        }
    });
}

extern "C" fn on_read_tail(
    ptr: *const c_char,
    len: usize,
    offset: u64,
    n: usize,
    buf: *mut c_char,
) -> i32 {
    guarded(0, || {
        if buf.is_null() || n == 0 || n > super::registry::MAX_TAIL {
            return 0;
        }
        let Some(p) = path(ptr, len) else { return 0 };
        let Some(bytes) = super::fs::read_tail(p, offset, n) else {
            return 0;
        };
        if bytes.len() != n {
            return 0;
        }
        // SAFETY: `buf` is the caller's scratch of at least `n` bytes (checked non-null and
        // `n` capped above); exactly `n` bytes are written.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, n) };
        1
    })
}
