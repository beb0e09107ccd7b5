//! Walking a store's checkpoint directory: every file hashed (SHA-256 + CRC32 in one read,
//! files in parallel on every core) unless the hash cache vouches for it, nested directories
//! kept, anything that is not a regular file or directory refused.
//!
//! Blocking: call from `spawn_blocking`.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::hashcache::{CacheKey, HashCache};
use crate::digest::{hash_files_in_parallel, FileDigest};
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
