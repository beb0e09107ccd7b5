//! The swap of a store dir (DESIGN §8): a complete tree staged in `<store dir>.blobsnap-staging`
//! is exchanged with the store dir atomically (`renameat2(RENAME_EXCHANGE)`), or, where the
//! filesystem lacks it, moved in with two renames under an intent file that the next run rolls
//! forward. A tree is complete when it holds [`RESTORED_MARKER`]. Paths only: nothing here
//! knows of snapshots or stores.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::index::RESTORED_MARKER;

/// `dir` with `suffix` appended to its name: a sibling in the same parent.
pub fn sibling(dir: &Path, suffix: &str) -> Result<PathBuf> {
    let name = dir
        .file_name()
        .ok_or_else(|| Error::invalid(format!("store dir {} has no name", dir.display())))?;
    let mut n = name.to_os_string();
    n.push(suffix);
    Ok(dir.with_file_name(n))
}

/// The directory that holds `path`: its parent, or `.` for a bare relative name (`r1`,
/// `r1/`), whose parent is the empty path (which no system call accepts).
pub fn parent_dir(path: &Path) -> Result<&Path> {
    match path.parent() {
        Some(p) if p.as_os_str().is_empty() => Ok(Path::new(".")),
        Some(p) => Ok(p),
        None => Err(Error::invalid(format!(
            "{} has no parent directory",
            path.display()
        ))),
    }
}

/// `<store dir>.blobsnap-standby`: where a warm standby of the store's task keeps its copy
/// (`job::standby`), beside the store dir, on the same filesystem (its files are hard-linked).
pub fn standby_dir(store_dir: &Path) -> Result<PathBuf> {
    sibling(store_dir, ".blobsnap-standby")
}

/// `<store dir>.blobsnap-staging`
pub fn staging_dir(store_dir: &Path) -> Result<PathBuf> {
    sibling(store_dir, ".blobsnap-staging")
}

fn intent_file(store_dir: &Path) -> Result<PathBuf> {
    sibling(store_dir, ".blobsnap-intent")
}

/// Free bytes for an unprivileged writer on the filesystem that holds (or will hold) `dir`.
pub fn available_bytes(dir: &Path) -> Option<u64> {
    let mut probe = dir.to_path_buf();
    while !probe.exists() {
        probe = probe.parent()?.to_path_buf();
    }
    rustix::fs::statvfs(&probe)
        .ok()
        .map(|s| s.f_bavail.saturating_mul(s.f_frsize))
}

/// fsync a directory (its entries: creations, renames, removals).
pub fn fsync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(Error::io_with(format!("fsync {}", dir.display())))
}

/// fsync every directory of a tree, bottom-up (files are fsynced as they are written).
pub fn fsync_tree(dir: &Path) -> Result<()> {
    for (entry, md) in entries(dir)? {
        if md.is_dir() {
            fsync_tree(&entry.path())?;
        }
    }
    fsync_dir(dir)
}

/// The entries of `dir` with their own metadata (a symlink's, never its target's); an error
/// names the dir or the entry.
pub fn entries(dir: &Path) -> Result<Vec<(std::fs::DirEntry, std::fs::Metadata)>> {
    let list = Error::io_with(format!("list {}", dir.display()));
    std::fs::read_dir(dir)
        .map_err(list)?
        .map(|entry| {
            let entry = entry.map_err(Error::io_with(format!("list {}", dir.display())))?;
            let md = std::fs::symlink_metadata(entry.path())
                .map_err(Error::io_with(format!("stat {}", entry.path().display())))?;
            Ok((entry, md))
        })
        .collect()
}

/// Remove a tree; a missing one is not an error. Symlinks are removed, never followed.
pub fn remove_tree(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("remove {}", dir.display()), e)),
    }
}

/// Finish a swap that an earlier run left half done (the rename fallback): if the intent
/// file exists, the staging dir is complete; move it into place.
pub fn roll_forward(store_dir: &Path) -> Result<()> {
    let intent = intent_file(store_dir)?;
    let old = sibling(store_dir, ".blobsnap-old")?;
    if !intent.exists() {
        // No swap in progress: an old tree left beside the store dir (a swap whose last step,
        // its removal, did not happen) holds nothing anybody needs.
        return remove_tree(&old);
    }
    let staging = staging_dir(store_dir)?;
    if staging.join(RESTORED_MARKER).exists() {
        // The new tree is complete: whatever `old` holds (a leftover of an earlier swap, or
        // this swap's previous tree after a crash between the two renames) is not needed, and
        // it must go before the store dir can be moved aside.
        remove_tree(&old)?;
        if store_dir.exists() {
            std::fs::rename(store_dir, &old).map_err(Error::io_with(format!(
                "move {} aside",
                store_dir.display()
            )))?;
        }
        std::fs::rename(&staging, store_dir).map_err(Error::io_with(format!(
            "move {} into place",
            staging.display()
        )))?;
    }
    fsync_dir(parent_dir(store_dir)?)?;
    std::fs::remove_file(&intent)
        .map_err(Error::io_with(format!("remove {}", intent.display())))?;
    remove_tree(&old)
}

/// Exchange the complete staging tree with the store dir, atomically.
pub fn swap_in(store_dir: &Path, staging: &Path) -> Result<()> {
    let parent = parent_dir(store_dir)?;
    if !store_dir.exists() {
        std::fs::rename(staging, store_dir).map_err(Error::io_with(format!(
            "move {} into place",
            staging.display()
        )))?;
        return fsync_dir(parent);
    }
    match rustix::fs::renameat_with(
        rustix::fs::CWD,
        staging,
        rustix::fs::CWD,
        store_dir,
        rustix::fs::RenameFlags::EXCHANGE,
    ) {
        Ok(()) => {
            fsync_dir(parent)?;
            crate::crash::point("restore.after-exchange");
            // `staging` now holds the old tree.
            remove_tree(staging)
        }
        Err(e)
            if e == rustix::io::Errno::INVAL
                || e == rustix::io::Errno::NOSYS
                || e == rustix::io::Errno::OPNOTSUPP =>
        {
            tracing::warn!(dir = %store_dir.display(), "filesystem lacks RENAME_EXCHANGE; swapping with two renames and an intent file");
            let intent = intent_file(store_dir)?;
            std::fs::write(&intent, b"swap")
                .map_err(Error::io_with(format!("write {}", intent.display())))?;
            fsync_dir(parent)?;
            roll_forward(store_dir)
        }
        Err(e) => Err(Error::io(
            format!(
                "exchange {} with {}",
                staging.display(),
                store_dir.display()
            ),
            std::io::Error::from(e),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::parent_dir;
    use std::path::Path;

    #[test]
    fn a_bare_relative_name_has_the_current_dir_as_parent() {
        for (p, want) in [
            ("r1", "."),
            ("r1/", "."),
            ("./r1", "."),
            ("a/r1", "a"),
            ("../x/r1", "../x"),
            ("/abs/r1", "/abs"),
        ] {
            assert_eq!(parent_dir(Path::new(p)).unwrap(), Path::new(want), "{p}");
        }
        assert!(parent_dir(Path::new("/")).is_err());
    }
}
