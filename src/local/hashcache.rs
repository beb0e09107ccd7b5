//! The hash cache: SHA-256/CRC32 of files that are immutable by contract (`*.sst`, `*.blob`),
//! so that an SST hard-linked into checkpoint after checkpoint is read once, across restarts
//! too.
//!
//! Keyed by (name, device, inode, size, mtime in ns). Not by ctime, although DESIGN §7 lists
//! it: creating a hard link changes the inode's ctime, and every RocksDB checkpoint hard-links
//! every SST again, so a ctime key would miss on every commit. An SST is never rewritten in
//! place (RocksDB gives each new one a new, increasing number), so a file with the same name,
//! inode, size and nanosecond mtime is the same file.
//!
//! Stored next to the store directory (`<store dir>.blobsnap-hashcache`), outside the store and
//! its checkpoint dirs, as JSON followed by a line with the SHA-256 of that JSON: a torn or
//! altered file fails the check and is ignored (everything is re-hashed). Saving writes a temp
//! file, fsyncs and renames. Entries not seen by the last scan are dropped on save.

use std::collections::{HashMap, HashSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::digest::{FileDigest, Sha256};
use crate::error::{Error, Result};

/// What identifies an unchanged immutable file.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CacheKey {
    /// File name.
    pub name: String,
    /// Device.
    pub dev: u64,
    /// Inode.
    pub ino: u64,
    /// Size.
    pub size: u64,
    /// Modification time, ns since the epoch.
    pub mtime_ns: i128,
}

#[derive(Serialize, Deserialize)]
struct Entry {
    key: CacheKey,
    sha256: Sha256,
    crc32: u32,
}

#[derive(Default)]
struct Inner {
    map: HashMap<CacheKey, FileDigest>,
    seen: HashSet<CacheKey>,
}

/// A persistent hash cache for one store.
pub struct HashCache {
    path: PathBuf,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for HashCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HashCache({})", self.path.display())
    }
}

impl CacheKey {
    /// The key of the file `name` whose `symlink_metadata` is `md`.
    pub fn of(name: &str, md: &std::fs::Metadata) -> CacheKey {
        use std::os::unix::fs::MetadataExt as _;
        CacheKey {
            name: name.to_owned(),
            dev: md.dev(),
            ino: md.ino(),
            size: md.len(),
            mtime_ns: md.mtime() as i128 * 1_000_000_000 + md.mtime_nsec() as i128,
        }
    }
}

impl HashCache {
    /// The cache file of the store at `store_dir`: beside it, or, with `cache_dir`, in that
    /// dir under a name derived from the store dir's absolute path (a manual backup keeps its
    /// cache in the user's cache dir, never next to the database).
    pub fn path_in(store_dir: &Path, cache_dir: Option<&Path>) -> PathBuf {
        match cache_dir {
            Some(d) => {
                // The dir may not exist yet (a restore's target): its parent's real path.
                let abs = std::fs::canonicalize(store_dir)
                    .or_else(|_| {
                        let (parent, name) = (store_dir.parent(), store_dir.file_name());
                        match (parent, name) {
                            (Some(p), Some(n)) => {
                                let p = if p.as_os_str().is_empty() {
                                    Path::new(".")
                                } else {
                                    p
                                };
                                std::fs::canonicalize(p).map(|p| p.join(n))
                            }
                            _ => Err(std::io::Error::from(std::io::ErrorKind::NotFound)),
                        }
                    })
                    .unwrap_or(store_dir.to_path_buf());
                d.join(format!(
                    "{}.blobsnap-hashcache",
                    Sha256::of(abs.as_os_str().as_encoded_bytes())
                ))
            }
            None => Self::path_for(store_dir),
        }
    }

    /// The cache file of the store at `store_dir`.
    pub fn path_for(store_dir: &Path) -> PathBuf {
        let mut p = store_dir.as_os_str().to_owned();
        p.push(".blobsnap-hashcache");
        PathBuf::from(p)
    }

    /// Load the cache at `path`; a missing, torn or corrupt file gives an empty cache.
    pub fn load(path: PathBuf) -> Self {
        let map = std::fs::read(&path)
            .ok()
            .and_then(|bytes| Self::decode(&bytes))
            .unwrap_or_default();
        HashCache {
            path,
            inner: Mutex::new(Inner {
                map,
                seen: HashSet::new(),
            }),
        }
    }

    fn decode(bytes: &[u8]) -> Option<HashMap<CacheKey, FileDigest>> {
        let split = bytes.iter().rposition(|&b| b == b'\n')?;
        let (body, sum) = (&bytes[..split], &bytes[split + 1..]);
        let sum: Sha256 = std::str::from_utf8(sum).ok()?.trim().parse().ok()?;
        if Sha256::of(body) != sum {
            tracing::warn!("hash cache failed its checksum; ignoring it");
            return None;
        }
        let entries: Vec<Entry> = serde_json::from_slice(body).ok()?;
        Some(
            entries
                .into_iter()
                .map(|e| {
                    let d = FileDigest {
                        sha256: e.sha256,
                        crc32: e.crc32,
                        size: e.key.size,
                    };
                    (e.key, d)
                })
                .collect(),
        )
    }

    /// The cached digest of `key`, if any (marks the entry as seen).
    pub fn get(&self, key: &CacheKey) -> Option<FileDigest> {
        let mut inner = self.inner.lock().ok()?;
        let hit = inner.map.get(key).copied();
        if hit.is_some() {
            inner.seen.insert(key.clone());
        }
        hit
    }

    /// Remember `digest` for `key`.
    pub fn insert(&self, key: CacheKey, digest: FileDigest) {
        if let Ok(mut inner) = self.inner.lock() {
            inner.seen.insert(key.clone());
            inner.map.insert(key, digest);
        }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.inner.lock().map(|i| i.map.len()).unwrap_or(0)
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keep only entries seen since the last save, and write the cache durably.
    pub fn save(&self) -> Result<()> {
        let body = {
            let mut inner = self
                .inner
                .lock()
                .map_err(|_| Error::new(crate::ErrorKind::Io, "hash cache lock poisoned"))?;
            let seen = std::mem::take(&mut inner.seen);
            inner.map.retain(|k, _| seen.contains(k));
            let mut entries: Vec<Entry> = inner
                .map
                .iter()
                .map(|(k, d)| Entry {
                    key: k.clone(),
                    sha256: d.sha256,
                    crc32: d.crc32,
                })
                .collect();
            entries.sort_by(|a, b| a.key.name.cmp(&b.key.name));
            serde_json::to_vec(&entries)
                .map_err(|e| Error::invalid(format!("serialize hash cache: {e}")))?
        };
        let mut tmp = self.path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let write = || -> std::io::Result<()> {
            if let Some(parent) = self.path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&body)?;
            f.write_all(b"\n")?;
            f.write_all(Sha256::of(&body).to_hex().as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, &self.path)
        };
        write().map_err(|e| Error::io(format!("save hash cache {}", self.path.display()), e))
    }
}
