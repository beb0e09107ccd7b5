//! The proof of a fetched file: its digest, by the hash-cache key of the inode a lazy restore
//! fetched, verified and placed. Its lock is last in the module's lock order (taken alone or
//! under a file's state).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};

use super::registry::Remote;
use crate::digest::FileDigest;
use crate::local::hashcache::CacheKey;

/// Files a lazy restore fetched and verified, by the hash-cache key of the file as placed
/// (name, device, inode, size, mtime), per store dir: a checkpoint's hard link of one has the
/// same key, so the backup's scan takes its SHA-256 from here instead of reading the file
/// ([`proof`]) and records it in its own hash cache. Dropped when the store closes.
pub(super) fn proofs() -> MutexGuard<'static, HashMap<PathBuf, HashMap<CacheKey, FileDigest>>> {
    static P: OnceLock<Mutex<HashMap<PathBuf, HashMap<CacheKey, FileDigest>>>> = OnceLock::new();
    P.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The digest of the immutable file whose hash-cache key is `key`, when a lazy restore of
/// this process fetched, verified and placed that very inode.
pub fn proof(key: &CacheKey) -> Option<FileDigest> {
    let p = proofs();
    p.values().find_map(|m| m.get(key).copied())
}

pub(super) fn record_proof(dir: &Path, remote: &Remote, dest: &Path) {
    let (Some(sha256), Ok(md)) = (remote.entry.sha256, std::fs::symlink_metadata(dest)) else {
        return;
    };
    let digest = FileDigest {
        sha256,
        crc32: remote.entry.checksum,
        size: md.len(),
    };
    proofs()
        .entry(dir.to_path_buf())
        .or_default()
        .insert(CacheKey::of(&remote.name, &md), digest);
}

/// Forget the proofs of the store at `dir` (it closed).
pub(super) fn forget(dir: &Path) {
    proofs().remove(dir);
}
