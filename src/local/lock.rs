//! The store-dir lock: `<store dir>.blobsnap.lock`, beside the store dir, held exclusively
//! (`flock`, which belongs to the open file description: two tasks of one process exclude
//! each other as two processes do) from before a restore into the dir for as long as the
//! database in it is open. A restore under a database that another process (or task) still
//! has open would exchange the tree under it; that process would keep writing tables by name
//! into the new tree and its compactions would unlink restored files.
//!
//! Taking the lock also checks RocksDB's own lock on `<store dir>/LOCK`, so a database held
//! open by a process that does not take ours (an older blobsnap, another program) is found
//! too. That check is safe only under our lock: a POSIX record lock belongs to the process,
//! and closing any descriptor of `LOCK` in the process that holds it open would drop it —
//! holding ours first proves no task of this process has the database open.

use std::path::{Path, PathBuf};

use crate::error::{Error, ErrorKind, Result};

/// An exclusive hold on a store dir; released on drop.
#[derive(Debug)]
pub struct StoreDirLock {
    path: PathBuf,
    _file: std::fs::File,
}

/// What a holder writes in its lock file: its pid and command line (at most a few hundred
/// bytes of it).
fn identity() -> String {
    let args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let command: String = args.join(" ").chars().take(200).collect();
    format!("pid {} ({command})\n", std::process::id())
}

/// The holder a lock file names, as its holder wrote it (at most 512 bytes, one line), or
/// "another task or process" when it says nothing readable (a holder of an older version, or
/// another task of this very process still writing it).
pub fn holder(path: &Path) -> String {
    let mut buf = [0u8; 512];
    let read = |buf: &mut [u8]| {
        std::fs::File::open(path)
            .and_then(|mut f| std::io::Read::read(&mut f, buf))
            .unwrap_or(0)
    };
    // A holder writes who it is right after it takes the lock: an empty file is one caught
    // in between (two processes started together), so look again a few times (≤ 100 ms).
    let mut n = read(&mut buf);
    for _ in 0..20 {
        if n > 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
        n = read(&mut buf);
    }
    let text = String::from_utf8_lossy(&buf[..n]);
    let line = text.lines().next().unwrap_or("").trim();
    let printable = !line.is_empty() && !line.chars().any(char::is_control);
    if printable && line.starts_with("pid ") {
        let same = line
            .strip_prefix("pid ")
            .and_then(|r| r.split_whitespace().next())
            .is_some_and(|p| p == std::process::id().to_string());
        if same {
            format!("another task of this process, {line}")
        } else {
            line.to_string()
        }
    } else {
        "another task or process".into()
    }
}

/// `<store dir>.blobsnap.lock`
pub fn lock_path(store_dir: &Path) -> Result<PathBuf> {
    let name = store_dir
        .file_name()
        .ok_or_else(|| Error::invalid(format!("store dir {} has no name", store_dir.display())))?;
    let mut n = name.to_os_string();
    n.push(".blobsnap.lock");
    Ok(store_dir.with_file_name(n))
}

impl StoreDirLock {
    /// Take the lock of `store_dir` (creating the lock file and the dir's parent). Held by
    /// another task or process, or the database in the dir open in another process →
    /// `Conflict`, nothing touched.
    pub fn acquire(store_dir: &Path) -> Result<StoreDirLock> {
        let path = lock_path(store_dir)?;
        let lock = StoreDirLock::at(&path, &format!("store dir {}", store_dir.display()))?;
        if store_dir.join("LOCK").exists() {
            // Locked by a RocksDB of another process → Conflict; we drop it at once.
            drop(super::rocks::ClosedDb::lock(store_dir).map_err(|e| {
                if e.kind() == ErrorKind::Conflict {
                    Error::new(
                        ErrorKind::Conflict,
                        format!(
                            "the database in {} is open in another process: nothing restored",
                            store_dir.display()
                        ),
                    )
                } else {
                    e
                }
            })?);
        }
        Ok(lock)
    }

    /// Take the lock file `path` itself (creating it and its parent), for `what` (a store dir,
    /// a demo's working dir): held by another task or process → `Conflict` naming the holder
    /// as it wrote itself into the file. The holder deletes the file when it lets go.
    pub fn at(path: &Path, what: &str) -> Result<StoreDirLock> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| Error::io(format!("create {}", parent.display()), e))?;
        }
        // A holder deletes the lock file when it lets go (nothing is left beside the dir):
        // the file locked here must still be the one at `path`, else a holder unlinked it
        // between this open and this lock — open the new one and lock again.
        let mut attempts = 0;
        let file = loop {
            attempts += 1;
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
            rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive)
                .map_err(|e| {
                    if e == rustix::io::Errno::WOULDBLOCK {
                        Error::new(
                            ErrorKind::Conflict,
                            format!(
                                "{what} is in use by {} (it holds the lock file {}; stop it, or use another dir)",
                                holder(path),
                                path.display()
                            ),
                        )
                    } else {
                        Error::io(format!("lock {}", path.display()), e.into())
                    }
                })?;
            if same_file(&file, path) {
                break file;
            }
            if attempts >= 16 {
                return Err(Error::new(
                    ErrorKind::Conflict,
                    format!(
                        "{what}: its lock file {} keeps being replaced (another process takes and lets go of it again and again)",
                        path.display()
                    ),
                ));
            }
        };
        // Who holds it, for the message of the next one who asks (best effort: the lock is
        // the flock, not these bytes).
        let _ = file.set_len(0).and_then(|()| {
            use std::io::Write as _;
            (&file).write_all(identity().as_bytes())
        });
        Ok(StoreDirLock {
            path: path.to_path_buf(),
            _file: file,
        })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Whether `path` names the file `file` is open on (same device and inode).
fn same_file(file: &std::fs::File, path: &Path) -> bool {
    match (rustix::fs::fstat(file), rustix::fs::stat(path)) {
        (Ok(a), Ok(b)) => a.st_dev == b.st_dev && a.st_ino == b.st_ino,
        _ => false,
    }
}

impl Drop for StoreDirLock {
    /// Deletes the lock file while still holding it (issue 51, item 12: a restore, failed or
    /// not, left `<dir>.blobsnap.lock` beside its target); the next holder re-checks that the
    /// file it locked is still the one at the path ([`StoreDirLock::acquire`]).
    fn drop(&mut self) {
        if same_file(&self._file, &self.path) {
            if let Err(e) = std::fs::remove_file(&self.path) {
                tracing::debug!(path = %self.path.display(), error = %e, "could not delete the store-dir lock file");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_even_in_one_process() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("counts").join("Partition_0");
        let a = StoreDirLock::acquire(&dir).unwrap();
        assert_eq!(
            a.path(),
            tmp.path().join("counts/Partition_0.blobsnap.lock")
        );
        let e = StoreDirLock::acquire(&dir).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
        let path = a.path().to_path_buf();
        drop(a);
        assert!(!path.exists(), "the lock file goes with its holder");
        let b = StoreDirLock::acquire(&dir).unwrap();
        assert!(path.exists());
        drop(b);
    }

    /// A file opened before its holder let go (and deleted it) is not the lock any more: the
    /// next taker locks the file at the path, and two takers never both hold it.
    #[test]
    fn a_lock_file_deleted_under_a_waiter_is_not_taken_for_the_lock() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("s");
        let a = StoreDirLock::acquire(&dir).unwrap();
        // A waiter's descriptor on the file `a` holds, opened before `a` lets go.
        let stale = std::fs::File::open(a.path()).unwrap();
        let path = a.path().to_path_buf();
        drop(a);
        // The stale descriptor locks fine (its inode is free), but it is not at the path.
        rustix::fs::flock(&stale, rustix::fs::FlockOperation::NonBlockingLockExclusive).unwrap();
        assert!(!same_file(&stale, &path));
        let b = StoreDirLock::acquire(&dir).unwrap();
        assert!(same_file(&b._file, &path));
        assert_eq!(
            StoreDirLock::acquire(&dir).unwrap_err().kind(),
            ErrorKind::Conflict
        );
    }
}
