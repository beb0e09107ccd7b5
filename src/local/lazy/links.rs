//! Checkpoint dirs of a lazily restored store. A RocksDB checkpoint "links" remote files: the
//! link is recorded (in the registry, and durably in the dir's [`LAZY_PENDING`] list, which
//! marks the dir incomplete for every other reader), and made for real once the file is local
//! ([`materialize`]). `links_io` is first in the module's lock order.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard};

use super::registry::{absolute, count, find, is_served, registry, split, FileState, ACTIVE};
use crate::digest::FileDigest;
use crate::error::{Error, ErrorKind, Result};
use crate::index::{FileIndex, LAZY_PENDING};

/// Record in `dir` (a restore's staging tree, before it is swapped in) that `files` are
/// remote: [`LAZY_PENDING`], the durable list of them (one JSON index entry a line: name,
/// size, SHA-256, blob), fsynced. It is removed once every file is local; while it is there,
/// the dir is not a complete database and nothing opens or backs it up as one
/// ([`check_complete`]).
pub fn write_pending(dir: &Path, files: &[FileIndex]) -> Result<()> {
    use std::io::Write as _;
    let path = dir.join(LAZY_PENDING);
    let mut bytes = Vec::new();
    for f in files {
        bytes.extend(pending_line(&path, f)?);
    }
    std::fs::File::create(&path)
        .and_then(|mut f| f.write_all(&bytes).and_then(|()| f.sync_all()))
        .map_err(Error::io_with(format!("write {}", path.display())))
}

pub(super) fn pending_line(path: &Path, entry: &FileIndex) -> Result<Vec<u8>> {
    let mut line = serde_json::to_vec(entry)
        .map_err(|e| Error::invalid(format!("{}: {e}", path.display())))?;
    line.push(b'\n');
    Ok(line)
}

/// The names a [`LAZY_PENDING`] file lists (`None`: unreadable or not a list).
pub(super) fn read_pending(dir: &Path) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(dir.join(LAZY_PENDING)).ok()?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()?
                .get("file-name")?
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

/// `Err` when `dir` holds a lazy restore's files-still-remote list ([`LAZY_PENDING`]: a store
/// dir, or a RocksDB checkpoint of one taken while files were remote) and no lazy restore of
/// this process serves it (the process that made it stopped or died before every file was
/// local): its MANIFEST names files that are not there. The error names them. A restore
/// completes a store dir; a checkpoint dir is complete in the checkpoints taken after its
/// store's files were all local.
pub fn check_complete(dir: &Path) -> Result<()> {
    if !dir.join(LAZY_PENDING).exists() || is_served(dir) {
        return Ok(());
    }
    let missing = match read_pending(dir) {
        Some(names) => {
            let missing: Vec<String> = names
                .into_iter()
                .filter(|n| std::fs::symlink_metadata(dir.join(n)).is_err())
                .collect();
            let shown = missing
                .iter()
                .take(5)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ");
            let more = missing.len().saturating_sub(5);
            format!(
                "{} files it lists are missing ({shown}{})",
                missing.len(),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            )
        }
        None => "its list is unreadable".to_string(),
    };
    Err(Error::new(
        ErrorKind::InvalidInput,
        format!(
            "{} is an incomplete lazy restore: not every file had been fetched when it was made ({LAZY_PENDING}: {missing}): restore the store again, or back up a checkpoint taken once every file was local",
            dir.display()
        ),
    ))
}

/// The remote files RocksDB linked into `dir` (a checkpoint of a lazily restored store), as
/// the scan reports files: name, digest (from the index entry: nothing read) and entry.
pub fn remote_files_in(dir: &Path) -> Vec<(String, FileDigest, FileIndex)> {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return Vec::new();
    }
    let Ok(dir) = absolute(dir) else {
        return Vec::new();
    };
    let r = registry();
    let Some(links) = r.links.get(&dir) else {
        return Vec::new();
    };
    links
        .iter()
        .filter_map(|(name, remote)| {
            let sha256 = remote.entry.sha256?;
            let digest = FileDigest {
                sha256,
                crc32: remote.entry.checksum,
                size: remote.entry.file_metadata.size,
            };
            Some((name.clone(), digest, remote.entry.clone()))
        })
        .collect()
}

/// Serializes the writers of checkpoint dirs' [`LAZY_PENDING`] lists and their hard links
/// ([`link`], [`renamed`], [`materialize`]). First in the module's lock order; held across
/// local file-system calls only (an append of one line, a hard link, an fsync), never across
/// a fetch.
pub(super) fn links_io() -> MutexGuard<'static, ()> {
    static L: Mutex<()> = Mutex::new(());
    L.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// RocksDB hard-links `src` to `dst` (a checkpoint): when `src` is remote, record `dst` as
/// naming the same remote file and return true (nothing is made on disk but a line of the
/// checkpoint dir's [`LAZY_PENDING`] list, which marks the dir incomplete for every other
/// reader until [`materialize`] links the fetched file in). False: link it for real — also
/// when the list cannot be written, so the checkpoint fails rather than be incomplete and
/// unmarked.
pub(super) fn link(src: &Path, dst: &Path) -> bool {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return false;
    }
    let _io = links_io();
    let (dir, name, entry, first) = {
        let mut r = registry();
        let Some((_, remote)) = find(&r, src) else {
            return false;
        };
        if !remote.is_remote() {
            return false;
        }
        let Some((dir, name)) = split(dst) else {
            return false;
        };
        let Ok(dir) = absolute(dir) else {
            return false;
        };
        // No pruning of dirs that do not exist here (issue 46, L2): another store's
        // checkpoint may be between RocksDB's rename of its `.tmp` dir and the rename's
        // callback ([`renamed`]), its records under a name that no longer exists. The commit
        // manager forgets the dirs it deletes ([`forget_links`]).
        let first = !r.links.contains_key(&dir);
        let entry = remote.entry.clone();
        r.links
            .entry(dir.clone())
            .or_default()
            .insert(name.to_string(), remote);
        count(&r);
        (dir, name.to_string(), entry, first)
    };
    match append_pending(&dir, &entry, first) {
        Ok(()) => true,
        Err(e) => {
            tracing::error!(dir = %dir.display(), error = %e, "lazy restore: cannot record a remote file in a checkpoint dir");
            let mut r = registry();
            if let Some(l) = r.links.get_mut(&dir) {
                l.remove(&name);
                if l.is_empty() {
                    r.links.remove(&dir);
                }
            }
            count(&r);
            false
        }
    }
}

/// Append `entry` to `dir`'s [`LAZY_PENDING`]; the first line creates it, durably (file and
/// dir fsynced: from then on the dir is marked incomplete); the later lines are fsynced when
/// the checkpoint's dir is renamed into place ([`renamed`]).
pub(super) fn append_pending(dir: &Path, entry: &FileIndex, first: bool) -> Result<()> {
    use std::io::Write as _;
    let path = dir.join(LAZY_PENDING);
    let line = pending_line(&path, entry)?;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(Error::io_with(format!("open {}", path.display())))?;
    f.write_all(&line)
        .map_err(Error::io_with(format!("write {}", path.display())))?;
    if first {
        f.sync_all()
            .map_err(Error::io_with(format!("fsync {}", path.display())))?;
        sync_dir(dir)?;
    }
    Ok(())
}

pub(super) fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(Error::io_with(format!("fsync {}", dir.display())))
}

/// Hard-link every recorded remote file that is now local (fetched into its store dir) into
/// the checkpoint dirs that name it; a checkpoint dir with nothing left to link loses its
/// [`LAZY_PENDING`] (after an fsync of the links): it is a complete database on disk. Called
/// after each placement, after a checkpoint's rename, before RocksDB deletes a store file, and
/// when a store's download completes.
pub(super) fn materialize() {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return;
    }
    let _io = links_io();
    let todo: Vec<(PathBuf, String, PathBuf)> = {
        let r = registry();
        r.links
            .iter()
            .flat_map(|(dir, files)| {
                files
                    .iter()
                    .filter(|(_, remote)| *remote.state() == FileState::Local)
                    .map(move |(name, remote)| {
                        (
                            dir.clone(),
                            name.clone(),
                            remote.store_dir.join(&remote.name),
                        )
                    })
            })
            .collect()
    };
    if todo.is_empty() {
        return;
    }
    let mut linked = Vec::new();
    for (dir, name, src) in todo {
        match std::fs::hard_link(&src, dir.join(&name)) {
            Ok(()) => linked.push((dir, name)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => linked.push((dir, name)),
            // The dir is gone (deleted, or renamed and the rename's callback will call again).
            Err(e) => {
                tracing::debug!(src = %src.display(), dir = %dir.display(), error = %e, "lazy restore: link into a checkpoint dir deferred");
            }
        }
    }
    let mut emptied = Vec::new();
    {
        let mut r = registry();
        for (dir, name) in linked {
            if let Some(l) = r.links.get_mut(&dir) {
                l.remove(&name);
                if l.is_empty() {
                    r.links.remove(&dir);
                    emptied.push(dir);
                }
            }
        }
        count(&r);
    }
    for dir in emptied {
        // The links first, durably; then the list that said they were missing.
        if sync_dir(&dir).is_ok() && std::fs::remove_file(dir.join(LAZY_PENDING)).is_ok() {
            let _ = sync_dir(&dir);
        }
    }
}

/// The checkpoint dir `dir` was deleted (by the commit manager, with `std::fs`): forget the
/// remote files recorded in it.
pub fn forget_links(dir: &Path) {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return;
    }
    let Ok(dir) = absolute(dir) else { return };
    let _io = links_io();
    let mut r = registry();
    if r.links.remove(&dir).is_some() {
        count(&r);
    }
}
