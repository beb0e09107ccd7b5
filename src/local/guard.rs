//! What a command that replaces a directory may replace (a restore's `--to`, the demo's and a
//! standby's state dir): never the blob store it reads from, never a store dir another task
//! holds, never `/`, the home or the current directory, and, without a second explicit flag,
//! nothing that does not look like a store. A restore replaces its target whole (that is what
//! makes it atomic), so one slip of a path must not delete a home or the backups themselves.
//!
//! Paths are compared by what they are, not how they are spelled: each existing ancestor's
//! device and inode (`stat`), after the target's nearest existing ancestor is resolved, so a
//! symlink, a `..` or a bind mount (the same directory seen at two paths has the same device
//! and inode) cannot get around a guard. Paths only: nothing here knows of snapshots.

use std::path::{Path, PathBuf};

use super::swap::entries;
use crate::error::{Error, ErrorKind, Result};
use crate::index::RESTORED_MARKER;

/// The subdirectories RocksDB itself makes in a database dir (the WAL archive); a dir with any
/// other subdirectory does not look like a store.
pub const ROCKSDB_SUBDIRS: &[&str] = &["archive"];

/// A directory that no replaced directory may be, contain, or lie inside.
#[derive(Debug, Clone)]
pub struct Protected {
    /// What it is, for the message: "the local blob store in use".
    pub what: String,
    /// Where it is.
    pub path: PathBuf,
}

impl Protected {
    /// A protected directory named `what`.
    pub fn new(what: impl Into<String>, path: impl Into<PathBuf>) -> Protected {
        Protected {
            what: what.into(),
            path: path.into(),
        }
    }
}

/// What a directory about to be replaced holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Contents {
    /// It does not exist (it is created).
    Missing,
    /// It exists and is empty.
    Empty,
    /// blobsnap restored it (its `RESTORED` marker).
    Restored,
    /// It looks like a RocksDB store that blobsnap did not restore (`CURRENT` or a
    /// `MANIFEST-*` at its top, no subdirectory but RocksDB's own).
    Store,
    /// Anything else: someone's data.
    Other,
}

/// What replacing a directory deletes: its files and bytes, and its largest subdirectories.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Deletion {
    /// Regular files (and symlinks, which are removed, never followed).
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Subdirectories at the top, largest first (at most five): name, files, bytes.
    pub largest_subdirs: Vec<SubdirSize>,
}

/// One subdirectory of a [`Deletion`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct SubdirSize {
    /// Its name in the replaced dir.
    pub name: String,
    /// Files under it.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
}

impl std::fmt::Display for Deletion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} files, {} bytes", self.files, self.bytes)?;
        if !self.largest_subdirs.is_empty() {
            f.write_str("; largest subdirectories:")?;
            for d in &self.largest_subdirs {
                write!(f, " {}/ ({} files, {} bytes)", d.name, d.files, d.bytes)?;
            }
        }
        Ok(())
    }
}

/// How far a replacement may go: the flags of the command.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Allow {
    /// A missing, empty or blobsnap-restored dir only.
    #[default]
    Restored,
    /// Also a dir that looks like a store (`--force`).
    Store,
    /// Also any other dir (`--replace-any-dir`).
    AnyDir,
}

/// The outcome of [`check_replace`]: what the dir holds and, when it holds data blobsnap did
/// not restore, what replacing it deletes (for the plan, before anything is deleted).
#[derive(Debug, Clone)]
pub struct Replace {
    /// What the dir holds.
    pub contents: Contents,
    /// For [`Contents::Store`] and [`Contents::Other`]: what the replacement deletes.
    pub deletes: Option<Deletion>,
}

/// Check that `target` may be replaced: refused (`InvalidInput`, nothing changed), whatever
/// `allow` says, if it is, contains or lies inside a `protected` dir, is `/`, the user's home
/// or a parent of it, the current directory or a parent of it; refused (`Conflict`) if it is,
/// contains or lies inside a store dir whose lock another task or process holds; then refused
/// (`InvalidInput`) if its contents need more than `allow` gives. `flag` names the target in
/// messages (`--to`).
pub fn check_replace(
    flag: &str,
    target: &Path,
    protected: &[Protected],
    allow: Allow,
) -> Result<Replace> {
    refuse_special(flag, target, protected)?;
    refuse_held(flag, target)?;
    let contents = contents(target)?;
    let deletes = match contents {
        Contents::Store | Contents::Other => Some(deletion(target)?),
        _ => None,
    };
    let refused = match (&contents, allow) {
        (Contents::Store, Allow::Restored) => Some(
            "holds a RocksDB store that blobsnap did not restore (no RESTORED marker); give --force to replace it",
        ),
        (Contents::Other, Allow::Restored | Allow::Store) => Some(
            "is not empty and does not look like a store (no RESTORED marker, no CURRENT or MANIFEST, or subdirectories RocksDB does not make); give --replace-any-dir to delete it",
        ),
        _ => None,
    };
    if let Some(why) = refused {
        let d = deletes.as_ref().map(|d| d.to_string()).unwrap_or_default();
        return Err(Error::invalid(format!(
            "{flag} {} {why}; replacing it would delete {d}; nothing changed (restore into an empty or new directory instead)",
            target.display()
        )));
    }
    Ok(Replace { contents, deletes })
}

/// Refuse `target` if it is `/`, the home or the current directory (or a parent of either),
/// or is, contains or lies inside one of the `protected` dirs: a dir that is never replaced.
pub fn refuse_special(flag: &str, target: &Path, protected: &[Protected]) -> Result<()> {
    let t = Located::of(target)?;
    if t.chain.len() == 1 && t.exists {
        return Err(refused(flag, target, "is the root directory /"));
    }
    if let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        let home = PathBuf::from(home);
        if let Ok(h) = Located::of(&home) {
            if h.exists && t.exists && h.chain.contains(&t.chain[0]) {
                return Err(refused(
                    flag,
                    target,
                    &format!("is the home directory {} or a parent of it", home.display()),
                ));
            }
        }
    }
    if let Ok(cwd) = std::env::current_dir() {
        if let Ok(c) = Located::of(&cwd) {
            if t.exists && c.chain.contains(&t.chain[0]) {
                return Err(refused(
                    flag,
                    target,
                    &format!(
                        "is the current directory {} or a parent of it",
                        cwd.display()
                    ),
                ));
            }
        }
    }
    overlap(flag, target, &t, protected)
}

/// Refuse `target` if it is, contains or lies inside one of the `protected` dirs: for a
/// command that writes beside a dir rather than replaces it (`backup --db` never writes into
/// its source: the local store may not be, hold or lie inside the database dir).
pub fn refuse_overlap(flag: &str, target: &Path, protected: &[Protected]) -> Result<()> {
    overlap(flag, target, &Located::of(target)?, protected)
}

fn overlap(flag: &str, target: &Path, t: &Located, protected: &[Protected]) -> Result<()> {
    for p in protected {
        let Ok(pl) = Located::of(&p.path) else {
            continue;
        };
        // A protected dir not made yet (`backup` creates its store) can only come to lie
        // inside the target: its nearest existing ancestor is the target or inside it.
        let relation = if !pl.exists {
            (t.exists && pl.chain.contains(&t.chain[0])).then_some("contains")
        } else if t.exists && t.chain[0] == pl.chain[0] {
            Some("is")
        } else if t.exists && pl.chain.contains(&t.chain[0]) {
            Some("contains")
        } else if t.chain.contains(&pl.chain[0]) {
            Some("lies inside")
        } else {
            None
        };
        if let Some(r) = relation {
            return Err(refused(
                flag,
                target,
                &format!("{r} {} {}", p.what, p.path.display()),
            ));
        }
    }
    Ok(())
}

fn refused(flag: &str, target: &Path, why: &str) -> Error {
    Error::invalid(format!(
        "{flag} {} {why}: refused whatever the flags, nothing changed",
        target.display()
    ))
}

/// A path as the file system sees it: the identity (device, inode) of the path, if it exists,
/// or of its nearest existing ancestor, then of each ancestor up to `/`.
struct Located {
    exists: bool,
    chain: Vec<(u64, u64)>,
}

impl Located {
    fn of(path: &Path) -> Result<Located> {
        let abs = if path.is_absolute() {
            path.to_path_buf()
        } else {
            std::env::current_dir()
                .map_err(Error::io_with("the current directory"))?
                .join(path)
        };
        let mut probe: &Path = &abs;
        let mut exists = true;
        let real = loop {
            match std::fs::canonicalize(probe) {
                Ok(real) => break real,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    exists = false;
                    probe = probe.parent().ok_or_else(|| {
                        Error::invalid(format!("{} has no existing ancestor", path.display()))
                    })?;
                }
                Err(e) => return Err(Error::io(format!("resolve {}", probe.display()), e)),
            }
        };
        let mut chain = Vec::new();
        let mut at: Option<&Path> = Some(&real);
        while let Some(p) = at {
            let md = rustix::fs::stat(p)
                .map_err(|e| Error::io(format!("stat {}", p.display()), e.into()))?;
            chain.push((md.st_dev, md.st_ino));
            at = p.parent();
        }
        Ok(Located { exists, chain })
    }
}

/// Refuse `target` if it is, contains or lies inside a store dir that another task or
/// process holds (its `<dir>.blobsnap.lock`, `flock`ed): `Conflict`.
fn refuse_held(flag: &str, target: &Path) -> Result<()> {
    let abs = std::path::absolute(target)
        .map_err(Error::io_with(format!("resolve {}", target.display())))?;
    let mut at: Option<&Path> = Some(&abs);
    while let Some(p) = at {
        if p.file_name().is_some() {
            if let Some(lock) = held_lock(&super::lock::lock_path(p)?)? {
                let r = if p == abs { "is" } else { "lies inside" };
                return Err(Error::new(
                    ErrorKind::Conflict,
                    format!(
                        "{flag} {} {r} the store dir {} that {} holds ({}): nothing changed",
                        target.display(),
                        p.display(),
                        super::lock::holder(&lock),
                        lock.display()
                    ),
                ));
            }
        }
        at = p.parent();
    }
    if !abs.is_dir() {
        return Ok(());
    }
    let mut stack = vec![abs.clone()];
    while let Some(dir) = stack.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) => return Err(Error::io(format!("list {}", dir.display()), e)),
        };
        for entry in entries {
            let entry = entry.map_err(Error::io_with(format!("list {}", dir.display())))?;
            let ft = entry
                .file_type()
                .map_err(Error::io_with(format!("stat {}", entry.path().display())))?;
            if ft.is_dir() {
                stack.push(entry.path());
            } else if ft.is_file()
                && entry
                    .file_name()
                    .to_str()
                    .is_some_and(|n| n.ends_with(".blobsnap.lock"))
            {
                if let Some(lock) = held_lock(&entry.path())? {
                    return Err(Error::new(
                        ErrorKind::Conflict,
                        format!(
                            "{flag} {} contains a store dir that {} holds ({}): nothing changed",
                            target.display(),
                            super::lock::holder(&lock),
                            lock.display()
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// `Some(lock)` if the lock file exists and someone holds it.
fn held_lock(lock: &Path) -> Result<Option<PathBuf>> {
    let file = match std::fs::File::open(lock) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("open {}", lock.display()), e)),
    };
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockShared) {
        Ok(()) => Ok(None),
        Err(e) if e == rustix::io::Errno::WOULDBLOCK => Ok(Some(lock.to_path_buf())),
        Err(e) => Err(Error::io(format!("lock {}", lock.display()), e.into())),
    }
}

/// What `dir` holds (a symlink or a file there is `InvalidInput`: a restore never follows
/// one out of the place it was given).
pub fn contents(dir: &Path) -> Result<Contents> {
    let md = match std::fs::symlink_metadata(dir) {
        Ok(md) => md,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Contents::Missing),
        Err(e) => return Err(Error::io(format!("stat {}", dir.display()), e)),
    };
    if !md.is_dir() {
        return Err(Error::invalid(format!(
            "{} is not a directory (a symlink or a file): nothing changed",
            dir.display()
        )));
    }
    if dir.join(RESTORED_MARKER).is_file() {
        return Ok(Contents::Restored);
    }
    let mut empty = true;
    let mut rocks = false;
    let mut foreign_subdir = false;
    for entry in
        std::fs::read_dir(dir).map_err(Error::io_with(format!("list {}", dir.display())))?
    {
        let entry = entry.map_err(Error::io_with(format!("list {}", dir.display())))?;
        empty = false;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let ft = entry
            .file_type()
            .map_err(Error::io_with(format!("stat {}", entry.path().display())))?;
        if ft.is_dir() {
            foreign_subdir |= !ROCKSDB_SUBDIRS.contains(&name.as_ref());
        } else if ft.is_file() && (name == "CURRENT" || name.starts_with("MANIFEST-")) {
            rocks = true;
        }
    }
    Ok(if empty {
        Contents::Empty
    } else if rocks && !foreign_subdir {
        Contents::Store
    } else {
        Contents::Other
    })
}

/// Count what `dir` holds (symlinks are counted as files, never followed).
pub fn deletion(dir: &Path) -> Result<Deletion> {
    fn walk(dir: &Path) -> Result<(u64, u64)> {
        let (mut files, mut bytes) = (0u64, 0u64);
        for (entry, md) in entries(dir)? {
            if md.is_dir() {
                let (f, b) = walk(&entry.path())?;
                files = files.saturating_add(f);
                bytes = bytes.saturating_add(b);
            } else {
                files = files.saturating_add(1);
                bytes = bytes.saturating_add(md.len());
            }
        }
        Ok((files, bytes))
    }
    let mut out = Deletion::default();
    for (entry, md) in entries(dir)? {
        if md.is_dir() {
            let (files, bytes) = walk(&entry.path())?;
            out.files = out.files.saturating_add(files);
            out.bytes = out.bytes.saturating_add(bytes);
            out.largest_subdirs.push(SubdirSize {
                name: entry.file_name().to_string_lossy().into_owned(),
                files,
                bytes,
            });
        } else {
            out.files = out.files.saturating_add(1);
            out.bytes = out.bytes.saturating_add(md.len());
        }
    }
    out.largest_subdirs
        .sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
    out.largest_subdirs.truncate(5);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(dir: &Path) -> Protected {
        Protected::new("the local blob store in use", dir)
    }

    #[test]
    fn the_store_root_a_dir_holding_it_and_a_dir_inside_it_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("demo/store");
        std::fs::create_dir_all(root.join("jobs/x")).unwrap();
        let p = [store(&root)];
        for (target, word) in [
            (root.clone(), "is the local blob store"),
            (t.path().join("demo"), "contains the local blob store"),
            (root.join("jobs"), "lies inside the local blob store"),
            (
                root.join("jobs/new/deeper"),
                "lies inside the local blob store",
            ),
            (root.join("jobs/../.."), "contains the local blob store"),
        ] {
            let e = check_replace("--to", &target, &p, Allow::AnyDir).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
            assert!(e.to_string().contains(word), "{target:?}: {e}");
        }
        // A sibling is fine.
        check_replace("--to", &t.path().join("demo/r1"), &p, Allow::Restored).unwrap();
    }

    #[test]
    fn a_symlink_to_the_store_is_seen_through() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("store");
        std::fs::create_dir_all(&root).unwrap();
        std::os::unix::fs::symlink(&root, t.path().join("link")).unwrap();
        let e = check_replace(
            "--to",
            &t.path().join("link/x"),
            &[store(&root)],
            Allow::AnyDir,
        )
        .unwrap_err();
        assert!(e.to_string().contains("lies inside"), "{e}");
    }

    #[test]
    fn root_is_refused() {
        let e = check_replace("--to", Path::new("/"), &[], Allow::AnyDir).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
    }

    #[test]
    fn contents_tell_a_store_from_other_data() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("d");
        assert_eq!(contents(&d).unwrap(), Contents::Missing);
        std::fs::create_dir(&d).unwrap();
        assert_eq!(contents(&d).unwrap(), Contents::Empty);
        std::fs::write(d.join("notes.txt"), b"mine").unwrap();
        assert_eq!(contents(&d).unwrap(), Contents::Other);
        std::fs::write(d.join("CURRENT"), b"MANIFEST-000001\n").unwrap();
        assert_eq!(contents(&d).unwrap(), Contents::Store);
        std::fs::create_dir(d.join("archive")).unwrap();
        assert_eq!(contents(&d).unwrap(), Contents::Store);
        std::fs::create_dir(d.join("src")).unwrap();
        std::fs::write(d.join("src/a.rs"), b"0123456789").unwrap();
        assert_eq!(contents(&d).unwrap(), Contents::Other);
        let del = deletion(&d).unwrap();
        assert_eq!((del.files, del.bytes), (3, 4 + 16 + 10));
        assert_eq!(del.largest_subdirs[0].name, "src");
        let e = check_replace("--to", &d, &[], Allow::Store).unwrap_err();
        assert!(e.to_string().contains("--replace-any-dir"), "{e}");
        assert!(e.to_string().contains("3 files, 30 bytes"), "{e}");
        let r = check_replace("--to", &d, &[], Allow::AnyDir).unwrap();
        assert_eq!(r.contents, Contents::Other);
        std::fs::write(d.join(RESTORED_MARKER), b"").unwrap();
        assert_eq!(contents(&d).unwrap(), Contents::Restored);
    }

    #[test]
    fn a_dir_holding_a_held_store_dir_is_a_conflict() {
        let t = tempfile::tempdir().unwrap();
        let store_dir = t.path().join("state/p0/counts");
        std::fs::create_dir_all(&store_dir).unwrap();
        let _held = crate::local::lock::StoreDirLock::acquire(&store_dir).unwrap();
        for target in [
            t.path().join("state"),
            store_dir.clone(),
            store_dir.join("x"),
        ] {
            let e = check_replace("--to", &target, &[], Allow::AnyDir).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Conflict, "{target:?}: {e}");
        }
        drop(_held);
        check_replace("--to", &t.path().join("state"), &[], Allow::AnyDir).unwrap();
    }
}
