//! Walking a store's checkpoint directory: every file hashed (SHA-256 + CRC32 in one read,
//! files in parallel on every core) unless the hash cache vouches for it, nested directories
//! kept, anything that is not a regular file or directory refused.
//!
//! Blocking: call from `spawn_blocking`.
//!
//! ## The hash cache
//!
//! SHA-256/CRC32 of files that are immutable by contract (`*.sst`, `*.blob`),
//! so that an SST hard-linked into checkpoint after checkpoint is read once, across restarts
//! too.
//!
//! Keyed by (name, device, inode, size, mtime in ns). Not by ctime, although DESIGN §7 lists
//! it: creating a hard link changes the inode's ctime, and every RocksDB checkpoint hard-links
//! every SST again, so a ctime key would miss on every commit. An SST is never rewritten in
//! place (RocksDB gives each new one a new, increasing number), so a file with the same name,
//! inode, size and nanosecond mtime is the same file.
//!
//! The key is only as good as the filesystem's timestamps: on one that keeps whole seconds
//! (FAT/exFAT, HFS+, some FUSE and SMB mounts, ext4 with 128-byte inodes) it degrades to
//! name + inode + size + second. A key whose mtime has no sub-second part is therefore never
//! cached or looked up ([`CacheKey::fine_grained`]): such a file is hashed every time. (On a
//! fine-grained filesystem one file in 10⁹ lands on a whole second by chance and is merely
//! hashed again.)
//!
//! Stored next to the store directory (`<store dir>.blobsnap-hashcache`), outside the store and
//! its checkpoint dirs, as JSON followed by a line with the SHA-256 of that JSON: a torn or
//! altered file fails the check and is ignored (everything is re-hashed). Saving writes a temp
//! file, fsyncs and renames. Entries not seen by the last scan are dropped on save.

use std::collections::{HashMap, HashSet};
use std::io::Write as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::digest::{hash_files_in_parallel, FileDigest, Sha256};
use crate::error::{Error, Result};
use crate::index::{validate_name, FileMetadata};

/// A scanned file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalFile {
    /// Its name.
    pub name: String,
    /// Its full path.
    pub path: PathBuf,
    /// Digest and size (as hashed).
    pub digest: FileDigest,
    /// POSIX attributes for the index.
    pub metadata: FileMetadata,
}

/// A scanned directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalDir {
    /// Its name (`""` for the root).
    pub name: String,
    /// Its files, sorted by name.
    pub files: Vec<LocalFile>,
    /// Its sub-directories, sorted by name.
    pub dirs: Vec<LocalDir>,
}

impl LocalDir {
    /// Every file with its path relative to the root.
    pub fn all_files(&self) -> Vec<(String, &LocalFile)> {
        let mut out = Vec::new();
        self.collect("", &mut out);
        out
    }

    fn collect<'a>(&'a self, prefix: &str, out: &mut Vec<(String, &'a LocalFile)>) {
        for f in &self.files {
            out.push((format!("{prefix}{}", f.name), f));
        }
        for d in &self.dirs {
            d.collect(&format!("{prefix}{}/", d.name), out);
        }
    }
}

/// What a scan did.
#[derive(Debug, Default)]
pub struct ScanStats {
    /// Files found.
    pub files: AtomicU64,
    /// Bytes read to hash files.
    pub bytes_hashed: AtomicU64,
    /// Files whose hash came from the cache.
    pub cache_hits: AtomicU64,
}

/// Whether a file is immutable by contract (RocksDB never rewrites an SST or blob file in
/// place), so its hash may be cached.
pub fn is_immutable(name: &str) -> bool {
    name.ends_with(".sst") || name.ends_with(".blob")
}

/// Resolves uids and gids to names (from /etc/passwd and /etc/group, once).
#[derive(Debug, Default)]
pub struct Owners {
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
}

impl Owners {
    /// Load the local user and group databases (missing files give numeric names).
    pub fn load() -> Self {
        fn parse(path: &str) -> HashMap<u32, String> {
            std::fs::read_to_string(path)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| {
                    let mut it = l.split(':');
                    let name = it.next()?;
                    let _pw = it.next()?;
                    let id = it.next()?.parse().ok()?;
                    Some((id, name.to_string()))
                })
                .collect()
        }
        Owners {
            users: parse("/etc/passwd"),
            groups: parse("/etc/group"),
        }
    }

    fn user(&self, uid: u32) -> String {
        self.users
            .get(&uid)
            .cloned()
            .unwrap_or_else(|| uid.to_string())
    }

    fn group(&self, gid: u32) -> String {
        self.groups
            .get(&gid)
            .cloned()
            .unwrap_or_else(|| gid.to_string())
    }
}

fn millis(secs: i64, nsec: i64) -> u64 {
    (secs.max(0) as u64) * 1000 + (nsec.max(0) as u64) / 1_000_000
}

/// Scan `root` recursively. Immutable files are looked up in (and added to) `cache`.
///
/// The walk stats every file first; the files the cache cannot vouch for are then hashed on
/// every core (a full backup of new SSTs is bound by this hashing before its first PUT).
pub fn scan_dir(
    root: &Path,
    cache: Option<&HashCache>,
    owners: &Owners,
    stats: &ScanStats,
) -> Result<LocalDir> {
    scan_dir_only(root, None, cache, owners, stats)
}

/// [`scan_dir`] of only the top-level entries named in `only` (when given): everything else in
/// `root` is neither read nor listed (a closed database's LOG, LOCK and obsolete files).
pub fn scan_dir_only(
    root: &Path,
    only: Option<&std::collections::BTreeSet<String>>,
    cache: Option<&HashCache>,
    owners: &Owners,
    stats: &ScanStats,
) -> Result<LocalDir> {
    // Files of a lazy restore that are still remote, "linked" into this checkpoint by RocksDB
    // (nothing on disk): listed from their index entry, never read, hashed or cached. Asked
    // *before* the walk (issue 46, L1): a fetch that lands meanwhile links the file into this
    // dir and only then drops it from the list, so a name missing from this list was on disk
    // before the walk began and the walk sees it; asked after, a file placed between the two
    // would be in neither.
    let remote = crate::local::lazy::remote_files_in(root);
    crate::crash::test_point("scan.between-remote-list-and-walk");
    let mut pending = Vec::new();
    let mut tree = scan(
        root,
        String::new(),
        only,
        cache,
        owners,
        stats,
        &mut pending,
    )?;
    if !remote.is_empty() {
        for (name, digest, entry) in remote {
            if only.is_some_and(|only| !only.contains(&name))
                || tree.files.iter().any(|f| f.name == name)
            {
                continue;
            }
            stats.files.fetch_add(1, Ordering::Relaxed);
            tree.files.push(LocalFile {
                path: root.join(&name),
                name,
                digest,
                metadata: entry.file_metadata,
            });
        }
        tree.files.sort_by(|a, b| a.name.cmp(&b.name));
    }
    if pending.is_empty() {
        return Ok(tree);
    }
    let paths: Vec<&Path> = pending.iter().map(|p| p.path.as_path()).collect();
    let mut digests = HashMap::with_capacity(pending.len());
    for (p, d) in pending.iter().zip(hash_files_in_parallel(&paths)) {
        let d = d?;
        stats.bytes_hashed.fetch_add(d.size, Ordering::Relaxed);
        if d.size != p.key.size {
            return Err(Error::invalid(format!(
                "{} changed while being hashed ({} bytes, then {})",
                p.path.display(),
                p.key.size,
                d.size
            )));
        }
        if let (true, Some(c)) = (is_immutable(&p.key.name), cache) {
            c.insert(p.key.clone(), d);
        }
        digests.insert(p.path.clone(), d);
    }
    fill_digests(&mut tree, &digests);
    Ok(tree)
}

/// A file the walk found and the cache did not vouch for: hashed after the walk.
struct Pending {
    path: PathBuf,
    key: CacheKey,
}

fn fill_digests(dir: &mut LocalDir, digests: &HashMap<PathBuf, FileDigest>) {
    for f in &mut dir.files {
        if let Some(d) = digests.get(&f.path) {
            f.digest = *d;
            f.metadata.size = d.size;
        }
    }
    for d in &mut dir.dirs {
        fill_digests(d, digests);
    }
}

fn scan(
    dir: &Path,
    name: String,
    only: Option<&std::collections::BTreeSet<String>>,
    cache: Option<&HashCache>,
    owners: &Owners,
    stats: &ScanStats,
    pending: &mut Vec<Pending>,
) -> Result<LocalDir> {
    let mut out = LocalDir {
        name,
        ..Default::default()
    };
    let entries =
        std::fs::read_dir(dir).map_err(|e| Error::io(format!("list {}", dir.display()), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(format!("list {}", dir.display()), e))?;
        let path = entry.path();
        let name = entry.file_name().into_string().map_err(|n| {
            Error::invalid(format!("{}: file name {n:?} is not UTF-8", dir.display()))
        })?;
        if only.is_some_and(|only| !only.contains(&name)) {
            continue;
        }
        // blobsnap's own files (a restore's marker, a partial download) are never backed up.
        if crate::index::reserved_name(&name, out.name.is_empty()).is_err() {
            continue;
        }
        validate_name(&name)
            .map_err(|e| Error::invalid(format!("{}: {}", path.display(), e.message())))?;
        let md = std::fs::symlink_metadata(&path)
            .map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
        let ft = md.file_type();
        if ft.is_dir() {
            out.dirs
                .push(scan(&path, name, None, cache, owners, stats, pending)?);
        } else if ft.is_file() {
            stats.files.fetch_add(1, Ordering::Relaxed);
            let key = CacheKey::of(&name, &md);
            // An immutable file the hash cache vouches for — or that a lazy restore of this
            // process fetched and verified as this very inode (recorded in the cache then).
            let cached = if is_immutable(&name) {
                cache.and_then(|c| c.get(&key)).or_else(|| {
                    let d = crate::local::lazy::proof(&key)?;
                    if let Some(c) = cache {
                        c.insert(key.clone(), d);
                    }
                    Some(d)
                })
            } else {
                None
            };
            let digest = match cached {
                Some(d) => {
                    stats.cache_hits.fetch_add(1, Ordering::Relaxed);
                    d
                }
                None => {
                    // Hashed after the walk, in parallel (`fill_digests`).
                    pending.push(Pending {
                        path: path.clone(),
                        key,
                    });
                    FileDigest {
                        sha256: crate::digest::Sha256::from_bytes([0; 32]),
                        crc32: 0,
                        size: md.len(),
                    }
                }
            };
            out.files.push(LocalFile {
                name,
                path,
                digest,
                metadata: FileMetadata {
                    creation_time_millis: millis(md.mtime(), md.mtime_nsec()),
                    last_modified_time_millis: millis(md.mtime(), md.mtime_nsec()),
                    size: digest.size,
                    owner: owners.user(md.uid()),
                    group: owners.group(md.gid()),
                    permissions: FileMetadata::permissions_of(md.mode()),
                },
            });
        } else {
            let what = if ft.is_symlink() {
                "a symbolic link"
            } else {
                "not a regular file or directory"
            };
            return Err(Error::invalid(format!(
                "{} is {what}; a store snapshot may hold only regular files and directories",
                path.display()
            )));
        }
    }
    out.files.sort_by(|a, b| a.name.cmp(&b.name));
    out.dirs.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

// The hash cache.

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

impl CacheKey {
    /// Whether the mtime has a sub-second part: a key the cache may trust (see the module
    /// docs; DESIGN §7 refuses filesystems with timestamps coarser than 1 µs).
    pub fn fine_grained(&self) -> bool {
        self.mtime_ns.rem_euclid(1_000_000_000) != 0
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
        super::engine::sibling_of(store_dir, ".blobsnap-hashcache")
    }

    /// Load the cache at `path`; a missing, torn or corrupt file gives an empty cache, and so
    /// does one this process should not trust: not a regular file (a symlink is never
    /// followed), not owned by this process's user, or in a dir of another user or one
    /// everyone may write to (a cache maps files to digests the restore and backup then take
    /// without reading: a planted one would install or dedup wrong bytes).
    pub fn load(path: PathBuf) -> Self {
        let map = trusted(&path)
            .then(|| std::fs::read(&path).ok())
            .flatten()
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
        if !key.fine_grained() {
            return None;
        }
        let mut inner = self.inner.lock().ok()?;
        let hit = inner.map.get(key).copied();
        if hit.is_some() {
            inner.seen.insert(key.clone());
        }
        hit
    }

    /// Remember `digest` for `key`.
    pub fn insert(&self, key: CacheKey, digest: FileDigest) {
        if !key.fine_grained() {
            return;
        }
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
        // A temp name of this save's own, created new: an existing path (a symlink someone
        // planted included) is never opened, followed or truncated.
        let mut tmp = self.path.as_os_str().to_owned();
        tmp.push(format!(
            ".{}-{:016x}.tmp",
            std::process::id(),
            rand::random::<u64>()
        ));
        let tmp = PathBuf::from(tmp);
        let write = || -> std::io::Result<()> {
            if let Some(parent) = self.path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)?;
            f.write_all(&body)?;
            f.write_all(b"\n")?;
            f.write_all(Sha256::of(&body).to_hex().as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, &self.path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Error::io(format!("save hash cache {}", self.path.display()), e)
        })
    }
}

/// Whether the cache file at `path` may be read: absent (nothing to read), or a regular file
/// owned by this process's user, in a dir of that user that not everyone may write to.
fn trusted(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let uid = rustix::process::geteuid().as_raw();
    let Ok(md) = std::fs::symlink_metadata(path) else {
        return true;
    };
    let dir_ok = path
        .parent()
        .map(|p| {
            if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                p
            }
        })
        .and_then(|p| std::fs::metadata(p).ok())
        .is_some_and(|d| d.uid() == uid && d.mode() & 0o002 == 0);
    let ok = md.file_type().is_file() && md.uid() == uid && dir_ok;
    if !ok {
        tracing::warn!(cache = %path.display(), "hash cache not trusted (not a regular file of this user, in a dir of this user that not everyone may write to): ignoring it");
    }
    ok
}

#[cfg(test)]
mod trust_tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn one_entry(dir: &Path) -> HashCache {
        let c = HashCache::load(dir.join("c.blobsnap-hashcache"));
        let f = dir.join("000001.sst");
        std::fs::write(&f, b"x").unwrap();
        let md = std::fs::symlink_metadata(&f).unwrap();
        c.insert(
            CacheKey::of("000001.sst", &md),
            FileDigest {
                sha256: Sha256::of(b"x"),
                crc32: 0,
                size: 1,
            },
        );
        c
    }

    /// A cache saved and loaded in the user's own dir is read back; in a dir everyone may
    /// write to, or through a symlink, it is ignored (empty).
    #[test]
    fn a_cache_others_could_have_planted_is_ignored() {
        let tmp = tempfile::tempdir().unwrap();
        let own = tmp.path().join("own");
        std::fs::create_dir(&own).unwrap();
        one_entry(&own).save().unwrap();
        assert_eq!(HashCache::load(own.join("c.blobsnap-hashcache")).len(), 1);
        let leftovers: Vec<_> = std::fs::read_dir(&own)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "no temp file left: {leftovers:?}");

        let shared = tmp.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        one_entry(&shared).save().unwrap();
        assert!(HashCache::load(shared.join("c.blobsnap-hashcache")).is_empty());

        let link = own.join("link.blobsnap-hashcache");
        std::os::unix::fs::symlink(own.join("c.blobsnap-hashcache"), &link).unwrap();
        assert!(
            HashCache::load(link).is_empty(),
            "a symlink is not followed"
        );
    }

    /// A file whose mtime has no sub-second part (what a coarse-timestamp filesystem gives
    /// every file) is neither cached nor looked up: it is hashed every time (N11 of the second
    /// protocol review).
    #[test]
    fn a_whole_second_mtime_is_never_trusted() {
        let tmp = tempfile::tempdir().unwrap();
        let c = HashCache::load(tmp.path().join("c.blobsnap-hashcache"));
        let f = tmp.path().join("000001.sst");
        std::fs::write(&f, b"x").unwrap();
        let whole = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000);
        std::fs::File::options()
            .write(true)
            .open(&f)
            .unwrap()
            .set_modified(whole)
            .unwrap();
        let key = CacheKey::of("000001.sst", &std::fs::symlink_metadata(&f).unwrap());
        assert!(!key.fine_grained());
        let d = FileDigest {
            sha256: Sha256::of(b"x"),
            crc32: 0,
            size: 1,
        };
        c.insert(key.clone(), d);
        assert_eq!(c.get(&key), None);
        assert!(c.is_empty());
        let fine = CacheKey {
            mtime_ns: key.mtime_ns + 1_000,
            ..key
        };
        c.insert(fine.clone(), d);
        assert_eq!(c.get(&fine), Some(d));
    }
}
